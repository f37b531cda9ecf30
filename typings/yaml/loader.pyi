from .constructor import SafeConstructor
from .resolver import Resolver

class SafeLoader(SafeConstructor, Resolver):
    def __init__(self, stream: str | bytes) -> None: ...
