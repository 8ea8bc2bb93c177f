"""A job (or a job's live changes) as YAML text, as the job API takes it from the dashboard's job form."""

from __future__ import annotations

from typing import Any

import yaml

from vcrawl.errors import InvalidTask

__all__ = ["parse_job_yaml"]

_YAML_VALUES_MAX = 100_000
"""Values a YAML job may hold, an alias counting each time it is used: a few aliases of aliases
would otherwise expand to billions ("billion laughs") when the document is read or sent on."""


def parse_job_yaml(text: str, where: str) -> Any:
    """The data of one YAML document (a job, or live changes), refusing a key given twice.

    PyYAML keeps the last of two equal keys without a word; a job put together from the
    dashboard's fields and its YAML box would lose one of them silently.

    Raises:
        InvalidTask: ``where`` for text that is not YAML or too large once aliases are expanded;
            the key's path for a key given twice.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_repeated_keys(node, where)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise InvalidTask(where, f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _refuse_repeated_keys(root: yaml.Node, where: str) -> None:
    pending: list[tuple[yaml.Node, str]] = [(root, "")]
    for _ in range(_YAML_VALUES_MAX):
        if not pending:
            return
        node, path = pending.pop()
        if isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                child = f"{path}.{name}" if path else str(name)
                if name is not None and name != "<<":  # a merge key may repeat
                    if name in lines:
                        first, again = lines[name], key.start_mark.line + 1
                        raise InvalidTask(child, f"given twice (lines {first} and {again}): give it once")
                    lines[name] = key.start_mark.line + 1
                pending.append((value, child))
        elif isinstance(node, yaml.SequenceNode):
            pending.extend((item, f"{path}[{index}]") for index, item in enumerate(node.value))
    raise InvalidTask(where, f"more than {_YAML_VALUES_MAX} values (an alias counts each time it is used)")
