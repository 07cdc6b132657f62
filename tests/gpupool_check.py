"""Checks of gpupool's outputs shared by the tests (host, control, cuda, launcher).

validate(): the subset of JSON Schema that docs/stats-schema.json uses
(type, const, enum, minimum, required, properties, additionalProperties,
items, $ref to #/$defs), so the tests need no jsonschema package; when the
package is installed, it is used as well.

replay_trace(): reads a GPUPOOL_TRACE_FILE (docs/trace.md) and replays it
against a model: every free must release a block the model holds active.
"""
import json
import re

_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "number": (int, float),
    "integer": int,
}


def _is_type(value, name):
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def validate(doc, schema, root=None, path="$"):
    """Returns a list of problems (empty when doc conforms)."""
    root = root or schema
    errors = []
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/$defs/"), ref
        return validate(doc, root["$defs"][ref[len("#/$defs/"):]], root, path)
    t = schema.get("type")
    if t is not None:
        names = t if isinstance(t, list) else [t]
        if not any(_is_type(doc, n) for n in names):
            return [f"{path}: expected {t}, got {type(doc).__name__}"]
    if "const" in schema and doc != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}, got {doc!r}")
    if "enum" in schema and doc not in schema["enum"]:
        errors.append(f"{path}: {doc!r} not in {schema['enum']}")
    if "minimum" in schema and isinstance(doc, (int, float)) and doc < schema["minimum"]:
        errors.append(f"{path}: {doc} < {schema['minimum']}")
    if isinstance(doc, dict):
        for key in schema.get("required", []):
            if key not in doc:
                errors.append(f"{path}: missing {key!r}")
        props = schema.get("properties", {})
        for key, value in doc.items():
            if key in props:
                errors += validate(value, props[key], root, f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected {key!r}")
    if isinstance(doc, list) and "items" in schema:
        for i, item in enumerate(doc):
            errors += validate(item, schema["items"], root, f"{path}[{i}]")
    return errors


_full_validators = {}


def _full_validator(schema):
    """jsonschema's validator for `schema`, built once; None if not installed."""
    key = id(schema)
    if key not in _full_validators:
        try:
            import jsonschema  # optional: the full validator, when installed
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            _full_validators[key] = cls(schema)
        except ImportError:
            _full_validators[key] = None
    return _full_validators[key]


def validate_dump(line, schema):
    doc = json.loads(line)
    errors = validate(doc, schema)
    full = _full_validator(schema)
    if full is not None:
        errors += [f"jsonschema: {e.message}" for e in full.iter_errors(doc)]
    # Beyond the schema: totals are the sum of the arenas.
    for field, total in doc["totals"].items():
        s = sum(b["stats"][field] for b in doc["arenas"])
        if s != total:
            errors.append(f"totals.{field} = {total}, arenas sum to {s}")
    return doc, errors


_RECORD = re.compile(r"^([af]) (\d+) (\d+) (\d+) ([0-9a-f]+) (\d+) (\d+)(?: ([hmd])(?: (\d+))?)?$")


def replay_trace(path):
    """Returns (counts, problems). counts: allocs, frees, hits, misses,
    outside (served by a driver's memory pool: 'd'), active (blocks still
    active at the end), arenas."""
    arenas = {}
    records = []
    problems = []
    with open(path) as f:
        lines = f.read().splitlines()
    if not lines or lines[0] not in ("# gpupool trace 1", "# gpupool trace 2"):
        problems.append("missing header '# gpupool trace 2'")
    sites = set()
    for n, line in enumerate(lines, 1):
        if line.startswith("#") or not line:
            continue
        if line.startswith(("module ", "pyframe ")):
            continue
        if line.startswith("site "):
            sites.add(int(line.split(" ")[1]))
            continue
        if line.startswith("arena "):
            parts = line.split(" ", 4)
            arenas[int(parts[1])] = {"kind": parts[2], "group": parts[3],
                                     "name": parts[4] if len(parts) > 4 else ""}
            continue
        m = _RECORD.match(line)
        if not m:
            problems.append(f"line {n}: malformed: {line!r}")
            continue
        op, t, tid, arena, handle, req, size, hit, site = m.groups()
        if site is not None and int(site) not in sites:
            problems.append(f"line {n}: site {site} used before its 'site' line")
        if int(arena) not in arenas:
            problems.append(f"line {n}: arena {arena} used before its 'arena' line")
        if (op == "a") != (hit is not None):
            problems.append(f"line {n}: hit flag on the wrong record")
        # Sort key: time, then frees before allocations at the same time.
        records.append((int(t), 0 if op == "f" else 1, n, op, int(arena), handle,
                        int(req), int(size), hit))
    records.sort()
    active = {}
    counts = {"allocs": 0, "frees": 0, "hits": 0, "misses": 0, "outside": 0}
    for t, _, n, op, arena, handle, req, size, hit in records:
        key = (arena, handle)
        if op == "a":
            counts["allocs"] += 1
            counts[{"h": "hits", "d": "outside"}.get(hit, "misses")] += 1
            if key in active:
                problems.append(f"line {n}: block {handle} allocated while active")
            if size < req:
                problems.append(f"line {n}: size {size} < requested {req}")
            active[key] = (req, size)
        else:
            counts["frees"] += 1
            if active.pop(key, None) != (req, size):
                problems.append(f"line {n}: free of block {handle} not active with these sizes")
    counts["active"] = len(active)
    counts["arenas"] = len(arenas)
    return counts, problems
