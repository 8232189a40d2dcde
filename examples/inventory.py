"""A small inventory module: the demo file for `rest-lsp complete` (see docs/daemon.md).

The demo puts the cursor on the empty line inside `total_value` (the file's last line), where the daemon
completes the function body over several lines, helped by drafts from the similar `total_quantity` above.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 0
    tags: list[str] = field(default_factory=list)


class Inventory:
    def __init__(self) -> None:
        self.items: dict[str, Item] = {}

    def add(self, item: Item) -> None:
        if item.name in self.items:
            self.items[item.name].quantity += item.quantity
        else:
            self.items[item.name] = item

    def remove(self, name: str, quantity: int = 1) -> None:
        if name not in self.items:
            raise KeyError(f"no item named {name!r}")
        item = self.items[name]
        if item.quantity < quantity:
            raise ValueError(f"only {item.quantity} of {name!r} left")
        item.quantity -= quantity

    def total_quantity(self) -> int:
        total = 0
        for item in self.items.values():
            total += item.quantity
        return total

    def with_tag(self, tag: str) -> list[Item]:
        return [item for item in self.items.values() if tag in item.tags]

    def total_value(self) -> float:
        
