class BaseResolver:
    DEFAULT_SCALAR_TAG: str
    DEFAULT_SEQUENCE_TAG: str
    DEFAULT_MAPPING_TAG: str

class Resolver(BaseResolver): ...
