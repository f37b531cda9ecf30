from typing import Any

from .error import Mark

class Node:
    tag: str
    value: Any
    start_mark: Mark | None
    end_mark: Mark | None

class ScalarNode(Node):
    value: str

class CollectionNode(Node): ...

class SequenceNode(CollectionNode):
    value: list[Node]

class MappingNode(CollectionNode):
    value: list[tuple[Node, Node]]
