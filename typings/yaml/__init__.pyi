# The part of PyYAML (untyped) that the project uses: safe loading and dumping, the node
# classes strict_yaml walks, and the errors. Anything else stays Any through __getattr__.
# tests/test_typing_stubs.py checks every name here against the library.
from collections.abc import Iterator
from typing import Any

from . import constructor as constructor
from . import resolver as resolver
from .error import MarkedYAMLError as MarkedYAMLError
from .error import YAMLError as YAMLError
from .loader import SafeLoader as SafeLoader
from .nodes import MappingNode as MappingNode
from .nodes import Node as Node
from .nodes import ScalarNode as ScalarNode
from .nodes import SequenceNode as SequenceNode

def load(stream: str | bytes, Loader: type[SafeLoader]) -> Any: ...
def load_all(stream: str | bytes, Loader: type[SafeLoader]) -> Iterator[Any]: ...
def safe_load(stream: str | bytes) -> Any: ...
def safe_dump(data: Any, stream: None = None, **kwds: Any) -> str: ...
def __getattr__(name: str) -> Any: ...
