"""Kubernetes' own validation rules (the API server's, as of 1.20–1.31) for the pod fields a spec passes through, as
pure functions: each returns [(field, message)] naming the rule and its limit, empty when the API server would accept.

Reusable by any rule that puts a user's value into a pod: label and annotation keys/values, DNS names, quantities,
resource requirements, tolerations, volumes, mounts and environment variables."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Optional

Problem = tuple[str, str]

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
NAME_PART_MAX = 63  # the name part of a qualified name (label/annotation key), and a label value
ANNOTATIONS_MAX_BYTES = 256 * 1024  # the API server's total for all keys and values of one object
CONFIG_MAP_KEY_MAX = 253

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_CONFIG_MAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_BINARY = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal(10) ** 3,
            "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15,
            "E": Decimal(10) ** 18}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "…"


# ------------------------------------------------------------------------------------------------------ names
def dns_label(value: Any) -> Optional[str]:
    """A DNS-1123 label (volume names, …): the problem, or None."""
    if isinstance(value, str) and len(value) <= DNS_LABEL_MAX and _DNS_LABEL.match(value):
        return None
    return (f"{_short(value)} is not a DNS-1123 label: at most {DNS_LABEL_MAX} lowercase letters, digits and '-', "
            "starting and ending with a letter or digit")


def dns_subdomain(value: Any) -> Optional[str]:
    """A DNS-1123 subdomain (object names: Secrets, ConfigMaps, claims, classes, …): the problem, or None."""
    if isinstance(value, str) and len(value) <= DNS_SUBDOMAIN_MAX and _DNS_SUBDOMAIN.match(value):
        return None
    return (f"{_short(value)} is not a DNS-1123 subdomain: at most {DNS_SUBDOMAIN_MAX} lowercase letters, digits, "
            "'-' and '.', starting and ending with a letter or digit")


def qualified_name(key: Any, what: str = "key") -> Optional[str]:
    """A label or annotation key: [prefix/]name, prefix a DNS subdomain ≤ 253, name ≤ 63 of [A-Za-z0-9-_.]
    starting and ending alphanumeric."""
    if not isinstance(key, str):
        return f"{what} {_short(key)} must be a string"
    prefix, _, name = key.rpartition("/")
    if "/" in prefix:
        return f"{what} {_short(key)} has more than one '/': a key is [prefix/]name"
    if "/" in key and (not prefix or len(prefix) > DNS_SUBDOMAIN_MAX or not _DNS_SUBDOMAIN.match(prefix)):
        return (f"{what} {_short(key)}: the prefix before '/' must be a DNS-1123 subdomain of at most "
                f"{DNS_SUBDOMAIN_MAX} characters (lowercase letters, digits, '-', '.')")
    if len(name) > NAME_PART_MAX or not _NAME_PART.match(name):
        return (f"{what} {_short(key)}: the name part must be at most {NAME_PART_MAX} characters of [A-Za-z0-9-_.], "
                f"starting and ending with a letter or digit (it has {len(name)})")
    return None


def label_value(value: Any) -> Optional[str]:
    if isinstance(value, str) and len(value) <= NAME_PART_MAX and _LABEL_VALUE.match(value):
        return None
    return (f"value {_short(value)} must be at most {NAME_PART_MAX} characters of [A-Za-z0-9-_.], starting and ending "
            "with a letter or digit (or empty)")


def labels(mapping: Mapping[Any, Any], path: str) -> list[Problem]:
    """Labels or a nodeSelector (the same grammar)."""
    out = []
    for key, value in mapping.items():
        problem = qualified_name(key) or label_value(value)
        if problem:
            out.append((f"{path}[{key}]", problem))
    return out


def annotation_map(mapping: Mapping[Any, Any], path: str, reserved_bytes: int = 0) -> list[Problem]:
    """Annotation keys (as label keys; the API server lower-cases them first) and the total size, less
    `reserved_bytes` that the operator adds to the same object."""
    out = []
    for key in mapping:
        problem = qualified_name(key.lower() if isinstance(key, str) else key, "annotation key")
        if problem:
            out.append((f"{path}[{key}]", problem))
    size = sum(len(str(k)) + len(str(v)) for k, v in mapping.items())
    room = ANNOTATIONS_MAX_BYTES - reserved_bytes
    if size > room:
        out.append((path, f"annotations total {size} bytes of keys and values; the API server allows "
                          f"{ANNOTATIONS_MAX_BYTES} (256 KiB) per object, {room} once the operator's own are added: "
                          "shorten them or move data into a ConfigMap"))
    return out


def env_name(name: Any) -> Optional[str]:
    if isinstance(name, str) and _ENV_NAME.match(name) and name not in (".", "..") and not name.startswith(".."):
        return None
    return (f"{_short(name)} is not a valid environment variable name: letters, digits, '_', '-' and '.', not "
            "starting with a digit or '..'")


def config_map_key(key: Any) -> Optional[str]:
    if isinstance(key, str) and len(key) <= CONFIG_MAP_KEY_MAX and _CONFIG_MAP_KEY.match(key):
        return None
    if key is None:
        return "required: the key in the Secret or ConfigMap"
    return f"key {_short(key)} must be at most {CONFIG_MAP_KEY_MAX} characters of [-._a-zA-Z0-9]"


# -------------------------------------------------------------------------------------------------- quantities
def parse_quantity(value: Any) -> Optional[Decimal]:
    """A Kubernetes quantity (an int or a string like 500m, 64Gi, 1e3) in base units; None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    m = _QUANTITY.match(value) if isinstance(value, str) else None
    if not m:
        return None
    try:
        number, suffix = Decimal(m.group(1)), m.group(2) or ""
        if suffix in _BINARY:
            return number * _BINARY[suffix]
        if suffix[:1] in ("e", "E"):
            return number * (Decimal(10) ** int(suffix[1:]))
        return number * _DECIMAL[suffix]
    except (InvalidOperation, ValueError, OverflowError):
        return None


def quantity(value: Any) -> Optional[str]:
    """A non-negative quantity: the problem, or None."""
    q = parse_quantity(value)
    if q is None:
        return (f"{_short(value)} is not a Kubernetes quantity (a number with an optional suffix: 500m, 2, 64Gi, "
                "1e3)")
    if q < 0:
        return f"{_short(value)} must not be negative"
    return None


_STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def hugepages(name: str) -> bool:
    return name.startswith("hugepages-")


def overcommitable(name: str) -> bool:
    """cpu, memory, ephemeral-storage: requests may be below limits; extended resources (a name with a '/':
    GPUs, rdma/*, …) and hugepages-* may not."""
    return not hugepages(name) and ("/" not in name or "kubernetes.io/" in name)


def resource_name(name: Any) -> Optional[str]:
    if not isinstance(name, str):
        return f"resource name {_short(name)} must be a string"
    if "/" not in name:
        if name in _STANDARD_RESOURCES or (hugepages(name) and parse_quantity(name[len("hugepages-"):])):
            return None
        return (f"{_short(name)} is not a container resource: cpu, memory, ephemeral-storage, hugepages-<size>, "
                "or an extended resource named domain/name (e.g. nvidia.com/gpu)")
    if "kubernetes.io/" in name:
        return f"{_short(name)}: the kubernetes.io domain is reserved for Kubernetes' own resources"
    problem = qualified_name(name, "resource name")
    if problem is None and len(name) + len("requests.") > DNS_SUBDOMAIN_MAX + 1 + NAME_PART_MAX:
        problem = f"resource name {_short(name)} is too long"
    return problem


def resource_requirements(limits: Mapping[str, Any], requests: Mapping[str, Any], path: str) -> list[Problem]:
    """The API server's ResourceRequirements rules, for one container."""
    out: list[Problem] = []
    for side, table in (("limits", limits), ("requests", requests)):
        for name, value in table.items():
            where = f"{path}.{side}[{name}]"
            problem = resource_name(name) or quantity(value)
            if problem is None and not overcommitable(name) and not hugepages(name):
                q = parse_quantity(value)
                if q is not None and q != q.to_integral_value():
                    problem = f"{name} is counted in whole devices: {_short(value)} must be a whole number"
            if problem:
                out.append((where, problem))
    if out:
        return out
    for name, value in requests.items():
        where = f"{path}.requests[{name}]"
        if name not in limits:
            if not overcommitable(name):
                out.append((where, f"{name} is not overcommitable: Kubernetes requires a limit (\"Limit must be set "
                                   f"for non overcommitable resources\"); set {path}.limits[{name}]: {value} (requests "
                                   "equal to it or left out)"))
            continue
        req, lim = parse_quantity(value), parse_quantity(limits[name])
        if req is None or lim is None:
            continue
        if not overcommitable(name) and req != lim:
            out.append((where, f"{name}: requests ({value}) must equal limits ({limits[name]}) for a resource that "
                               "cannot be overcommitted; set both to the same value or leave requests out"))
        elif req > lim:
            out.append((where, f"{name}: requests ({value}) must be at most limits ({limits[name]})"))
    names = set(limits) | set(requests)
    if any(hugepages(n) for n in names) and not names & {"cpu", "memory"}:
        out.append((path, "hugepages need a cpu or memory request or limit as well (Kubernetes: \"HugePages require "
                          "cpu or memory\")"))
    return out


# ------------------------------------------------------------------------------------------------- tolerations
_TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _unknown_keys(obj: Mapping[Any, Any], known: Iterable[str], path: str, what: str) -> list[Problem]:
    known = tuple(known)
    out = []
    for key in obj:
        if key not in known:
            hint = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            out.append((f"{path}.{key}", f"unknown field {_short(key)} of a {what}"
                                         + (f"; did you mean '{hint[0]}'?" if hint else f" (known: {', '.join(known)})")))
    return out


def _string_fields(obj: Mapping[Any, Any], names: Iterable[str], path: str) -> list[Problem]:
    return [(f"{path}.{n}", f"must be a string (got {_short(obj[n])})") for n in names
            if n in obj and not isinstance(obj[n], str)]


def toleration(t: Any, path: str) -> list[Problem]:
    """The API server's toleration rules (operator Equal/Exists, Exists takes no value, effect, tolerationSeconds)."""
    if not isinstance(t, Mapping):
        return [(path, f"a toleration must be a mapping (got {_short(t)})")]
    out = _unknown_keys(t, _TOLERATION_KEYS, path, "toleration")
    out += _string_fields(t, ("key", "operator", "value", "effect"), path)
    if out:
        return out
    key, op, value, effect = t.get("key", ""), t.get("operator", "") or "Equal", t.get("value", ""), t.get("effect", "")
    if key and (problem := qualified_name(key)):
        out.append((f"{path}.key", problem))
    if not key and op != "Exists":
        out.append((f"{path}.operator", "operator must be Exists when key is empty (that tolerates every taint)"))
    if op == "Exists" and value:
        out.append((f"{path}.value", f"value must be empty when operator is Exists (got {_short(value)}): remove it, "
                                     "or use operator Equal"))
    elif op == "Equal" and (problem := label_value(value)):
        out.append((f"{path}.value", problem))
    elif op not in ("Equal", "Exists"):
        out.append((f"{path}.operator", f"operator must be Equal or Exists (got {_short(op)})"))
    if effect and effect not in _EFFECTS:
        out.append((f"{path}.effect", f"effect must be one of {', '.join(_EFFECTS)} or empty (got {_short(effect)})"))
    seconds = t.get("tolerationSeconds")
    if seconds is not None:
        if not isinstance(seconds, int) or isinstance(seconds, bool) or abs(seconds) > 2**63 - 1:
            out.append((f"{path}.tolerationSeconds", f"must be an integer (got {_short(seconds)})"))
        elif effect != "NoExecute":
            out.append((f"{path}.effect", "effect must be NoExecute when tolerationSeconds is set"))
    return out


# ----------------------------------------------------------------------------------------------------- volumes
# The volume sources of core/v1 Volume (exactly one per volume), and what each requires.
VOLUME_SOURCES = (
    "hostPath", "emptyDir", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "secret", "nfs", "iscsi",
    "glusterfs", "persistentVolumeClaim", "rbd", "flexVolume", "cinder", "cephfs", "flocker", "downwardAPI", "fc",
    "azureFile", "configMap", "vsphereVolume", "quobyte", "azureDisk", "photonPersistentDisk", "projected",
    "portworxVolume", "scaleIO", "storageos", "csi", "ephemeral",
)
_REQUIRED = {"persistentVolumeClaim": ("claimName",), "configMap": ("name",), "secret": ("secretName",),
             "hostPath": ("path",), "nfs": ("server", "path"), "csi": ("driver",)}
_NAMED_BY = {"persistentVolumeClaim": "claimName", "configMap": "name", "secret": "secretName"}
_EMPTY_DIR_MEDIA = ("", "Memory", "HugePages")


def volume(v: Any, path: str) -> list[Problem]:
    """One pod volume: a DNS-label name and exactly one source with what that source requires."""
    if not isinstance(v, Mapping):
        return [(path, f"a volume must be a mapping (got {_short(v)})")]
    out = []
    if (problem := dns_label(v.get("name"))) is not None:
        out.append((f"{path}.name", problem))
    out += _unknown_keys({k: None for k in v if k != "name"}, VOLUME_SOURCES, path, "volume")
    sources = [k for k in v if k in VOLUME_SOURCES]
    if len(sources) != 1:
        out.append((path, f"a volume needs exactly one source ({', '.join(_REQUIRED)}, …); got "
                          f"{', '.join(sources) if sources else 'none'}"))
        return out
    kind = sources[0]
    source = v[kind]
    if not isinstance(source, Mapping):
        return out + [(f"{path}.{kind}", f"must be a mapping (got {_short(source)})")]
    for req in _REQUIRED.get(kind, ()):
        if not isinstance(source.get(req), str) or not source.get(req):
            out.append((f"{path}.{kind}.{req}", "required (a non-empty string)"))
    name_field = _NAMED_BY.get(kind)
    if name_field and isinstance(source.get(name_field), str) and source.get(name_field):
        if (problem := dns_subdomain(source[name_field])) is not None:
            out.append((f"{path}.{kind}.{name_field}", problem))
    if kind == "emptyDir":
        medium = source.get("medium", "")
        if not (medium in _EMPTY_DIR_MEDIA or (isinstance(medium, str) and medium.startswith("HugePages-"))):
            out.append((f"{path}.emptyDir.medium", f"must be empty, Memory or HugePages (got {_short(medium)})"))
        if "sizeLimit" in source and (problem := quantity(source["sizeLimit"])):
            out.append((f"{path}.emptyDir.sizeLimit", problem))
    if kind in ("hostPath", "nfs") and isinstance(source.get("path"), str) and not source["path"].startswith("/"):
        out.append((f"{path}.{kind}.path", f"must be an absolute path (got {_short(source['path'])})"))
    return out


_MOUNT_KEYS = ("name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation")
_PROPAGATION = ("None", "HostToContainer")  # Bidirectional needs a privileged container, which the pods never are


def _relative(value: str) -> bool:
    return not value.startswith("/") and ".." not in value.split("/")


def volume_mount(m: Any, volume_names: Iterable[str], path: str) -> list[Problem]:
    """One volumeMount: it names a volume of the pod, an absolute mountPath, a relative subPath without '..'."""
    if not isinstance(m, Mapping):
        return [(path, f"a volume mount must be a mapping (got {_short(m)})")]
    out = _unknown_keys(m, _MOUNT_KEYS, path, "volume mount")
    out += _string_fields(m, ("name", "mountPath", "subPath", "subPathExpr", "mountPropagation"), path)
    if "readOnly" in m and not isinstance(m["readOnly"], bool):
        out.append((f"{path}.readOnly", f"must be true or false (got {_short(m['readOnly'])})"))
    if out:
        return out
    names = tuple(volume_names)
    name = m.get("name")
    if not name:
        out.append((f"{path}.name", "required: the name of a volume of the pod"))
    elif name not in names:
        out.append((f"{path}.name", f"no volume named {_short(name)}: add it to spec.template.volumes (the pods "
                                    f"have {', '.join(names)})"))
    mount_path = m.get("mountPath")
    if not mount_path or not mount_path.startswith("/"):
        out.append((f"{path}.mountPath", f"required: an absolute path (got {_short(mount_path)})"))
    elif ":" in mount_path:
        out.append((f"{path}.mountPath", f"must not contain ':' (got {_short(mount_path)})"))
    for sub in ("subPath", "subPathExpr"):
        if m.get(sub) and not _relative(m[sub]):
            out.append((f"{path}.{sub}", f"must be a relative path without '..' (got {_short(m[sub])})"))
    if m.get("subPath") and m.get("subPathExpr"):
        out.append((f"{path}.subPathExpr", "subPath and subPathExpr are mutually exclusive: keep one"))
    if m.get("mountPropagation") and m["mountPropagation"] not in _PROPAGATION:
        out.append((f"{path}.mountPropagation", f"must be None or HostToContainer (got "
                                                f"{_short(m['mountPropagation'])}; Bidirectional needs a privileged "
                                                "container)"))
    return out


# --------------------------------------------------------------------------------------------------------- env
_VALUE_FROM = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
_FIELD_PATHS = ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
                "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs")
_FIELD_PATH_KEYED = re.compile(r"^metadata\.(labels|annotations)\['[^']+'\]$")
_RESOURCE_FIELDS = ("limits.cpu", "limits.memory", "limits.ephemeral-storage", "requests.cpu", "requests.memory",
                    "requests.ephemeral-storage")


def env_value_from(value_from: Any, path: str) -> list[Problem]:
    """An EnvVarSource: exactly one reference, each with what the API server checks."""
    if not isinstance(value_from, Mapping):
        return [(path, f"must be a mapping (got {_short(value_from)})")]
    out = _unknown_keys(value_from, _VALUE_FROM, path, "valueFrom")
    refs = [k for k in value_from if k in _VALUE_FROM]
    if len(refs) != 1:
        return out + [(path, f"needs exactly one of {', '.join(_VALUE_FROM)} (got {', '.join(refs) or 'none'})")]
    kind = refs[0]
    ref, where = value_from[kind], f"{path}.{kind}"
    if not isinstance(ref, Mapping):
        return out + [(where, f"must be a mapping (got {_short(ref)})")]
    if kind in ("configMapKeyRef", "secretKeyRef"):
        out += _unknown_keys(ref, ("name", "key", "optional"), where, kind)
        if (problem := dns_subdomain(ref.get("name"))) is not None:
            out.append((f"{where}.name", problem))
        if (problem := config_map_key(ref.get("key"))) is not None:
            out.append((f"{where}.key", problem))
    elif kind == "fieldRef":
        out += _unknown_keys(ref, ("fieldPath", "apiVersion"), where, kind)
        fp = ref.get("fieldPath")
        if not (fp in _FIELD_PATHS or (isinstance(fp, str) and _FIELD_PATH_KEYED.match(fp))):
            out.append((f"{where}.fieldPath", f"{_short(fp)} is not a field the downward API gives: "
                                              f"{', '.join(_FIELD_PATHS)}, metadata.labels['…'], "
                                              "metadata.annotations['…']"))
        if ref.get("apiVersion", "v1") != "v1":
            out.append((f"{where}.apiVersion", "must be v1 (or left out)"))
    else:
        out += _unknown_keys(ref, ("resource", "divisor"), where, kind)
        if ref.get("resource") not in _RESOURCE_FIELDS:
            out.append((f"{where}.resource", f"must be one of {', '.join(_RESOURCE_FIELDS)} (containerName is left "
                                             "out: it defaults to the variable's own container)"))
        if "divisor" in ref and (problem := quantity(ref["divisor"])):
            out.append((f"{where}.divisor", problem))
    return out
