"""The name grammars cdi-gen must honour: CDI vendor, class, device name, kind and
fully-qualified device names, the Kubernetes extended-resource name, DNS labels, the DRA
driver name, a DRA share ID and a Linux network interface name.

The rules follow the CDI Go library's parser (what runtimes enforce) plus the limits the CDI
specification states but the parser does not check (name segment ≤ 63, prefix ≤ 253), so
that whatever we accept, every runtime accepts. One-character vendor and class names are
refused outright: the CDI library in podman 4.3 and containerd 1.7.24 panics on them.
"""

from __future__ import annotations

import base64
import hashlib
import re

from cdi_gen.errors import InvalidNameError, quote

_VENDOR_RE = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?")
_DEVICE_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN_RE = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

#: Longest vendor (a DNS subdomain in the CDI spec) and class / device name segment.
MAX_VENDOR_LEN = 253
MAX_SEGMENT_LEN = 63
#: Kubernetes: "requests." + domain must be a DNS subdomain of ≤ 253 characters.
MAX_RESOURCE_DOMAIN_LEN = 253 - len("requests.")


def _check_segment(kind: str, value: str, pattern: re.Pattern[str], alphabet: str) -> None:
    if not value:
        raise InvalidNameError(kind, value, "must not be empty")
    if pattern.fullmatch(value):
        return
    bad = next((c for c in value if not (c.isascii() and (c.isalnum() or c in alphabet))), None)
    if bad is not None:
        raise InvalidNameError(
            kind, value, f"invalid character {quote(bad)}, allowed: A-Z a-z 0-9 {alphabet}"
        )
    if not value[0].isalnum() or (kind != "device name" and not value[0].isalpha()):
        first = "a letter" if kind != "device name" else "a letter or digit"
        raise InvalidNameError(kind, value, f"should start with {first}")
    raise InvalidNameError(kind, value, "should end with a letter or digit")


def validate_vendor(vendor: str) -> None:
    """Raise :class:`InvalidNameError` unless ``vendor`` is a CDI vendor all runtimes accept."""
    _check_segment("vendor", vendor, _VENDOR_RE, "_.-")
    if len(vendor) == 1:
        raise InvalidNameError(
            "vendor", vendor, "must be at least 2 characters (1 crashes podman 4.3/containerd 1.7)"
        )
    if len(vendor) > MAX_VENDOR_LEN:
        raise InvalidNameError("vendor", vendor, f"longer than {MAX_VENDOR_LEN} characters")


def validate_class(cls: str) -> None:
    """Raise :class:`InvalidNameError` unless ``cls`` is a CDI class all runtimes accept.

    Dots are allowed by the grammar but need cdiVersion 0.6.0; :mod:`cdi_gen.cdi.version`
    accounts for that.
    """
    _check_segment("class", cls, _VENDOR_RE, "_.-")
    if len(cls) == 1:
        raise InvalidNameError(
            "class", cls, "must be at least 2 characters (1 crashes podman 4.3/containerd 1.7)"
        )
    if len(cls) > MAX_SEGMENT_LEN:
        raise InvalidNameError("class", cls, f"longer than {MAX_SEGMENT_LEN} characters")


def validate_device_name(name: str) -> None:
    """Raise :class:`InvalidNameError` unless ``name`` is a valid CDI device name.

    The kubelet also uses it as the device ID, whose documented limit is 63 characters.
    """
    _check_segment("device name", name, _DEVICE_RE, "_.:-")
    if len(name) > MAX_SEGMENT_LEN:
        raise InvalidNameError("device name", name, f"longer than {MAX_SEGMENT_LEN} characters")


#: Characters a device name may hold anywhere but at its ends (which are letters or digits).
_NOT_DEVICE_NAME_RE = re.compile(r"[^A-Za-z0-9_.:-]+")
#: Base32 characters of SHA-256 ending a device name that :func:`as_device_name` had to cut.
DEVICE_NAME_HASH_CHARS = 10


#: Linux IFNAMSIZ is 16 bytes with the terminating NUL: a name of at most 15 bytes.
MAX_INTERFACE_NAME_BYTES = 15


def validate_interface_name(name: str) -> None:
    """Raise :class:`InvalidNameError` unless the kernel accepts ``name`` for a network
    interface (``dev_valid_name``): 1 to 15 bytes, not ``.`` or ``..``, no ``/``, ``:`` or
    whitespace. A runtime moving an interface under an invalid name fails the container."""
    kind = "interface name"
    if not name:
        raise InvalidNameError(kind, name, "must not be empty")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_INTERFACE_NAME_BYTES:
        raise InvalidNameError(kind, name, f"longer than {MAX_INTERFACE_NAME_BYTES} bytes")
    if name in (".", ".."):
        raise InvalidNameError(kind, name, "must not be '.' or '..'")
    bad = next((c for c in name if c in "/:" or c.isspace() or ord(c) < 32), None)
    if bad is not None:
        raise InvalidNameError(kind, name, f"must not hold {bad!r} ('/', ':' or whitespace)")


def as_device_name(text: str) -> str:
    """``text`` made a valid device name, the template filter ``|name``.

    Every run of characters outside the grammar (``A-Z a-z 0-9 _ . : -``) becomes one ``-``,
    and ``_ . : -`` are trimmed from both ends (a name starts and ends with a letter or digit);
    case is kept, as the grammar allows both. A result over :data:`MAX_SEGMENT_LEN` is cut and
    ends in ``-`` and a hash of the whole ``text``, so two long values that differ only after
    the cut still get two names. A valid name is returned as it is, so the filter is
    idempotent. Raise :class:`InvalidNameError` when ``text`` holds no letter or digit.
    """
    name = _NOT_DEVICE_NAME_RE.sub("-", text).strip("_.:-")
    if not name:
        raise InvalidNameError("device name", text, "has no letter or digit A-Z a-z 0-9 to keep")
    if len(name) <= MAX_SEGMENT_LEN:
        return name
    digest = base64.b32encode(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())
    suffix = digest.decode("ascii").lower()[:DEVICE_NAME_HASH_CHARS]
    head = name[: MAX_SEGMENT_LEN - DEVICE_NAME_HASH_CHARS - 1].rstrip("_.:-")
    return f"{head}-{suffix}"


def parse_kind(kind: str) -> tuple[str, str]:
    """Split ``vendor/class`` and validate both parts; raise :class:`InvalidNameError`."""
    vendor, sep, cls = kind.partition("/")
    if not sep:
        raise InvalidNameError("kind", kind, "should be vendor/class")
    validate_vendor(vendor)
    validate_class(cls)
    return vendor, cls


def build_kind(vendor: str, cls: str) -> str:
    """Return ``vendor/class`` after validating both parts."""
    validate_vendor(vendor)
    validate_class(cls)
    return f"{vendor}/{cls}"


def parse_qualified_name(qualified: str) -> tuple[str, str, str]:
    """Split ``vendor/class=name`` into its parts, as the runtimes' parser does.

    The split happens at the first ``=`` and then at the first ``/``, so ``a/b/c=x`` has class
    ``b/c`` and is refused. Raises :class:`InvalidNameError`.
    """
    if not qualified:
        raise InvalidNameError("qualified device name", qualified, "must not be empty")
    if qualified.startswith("/"):
        raise InvalidNameError("qualified device name", qualified, "must not start with '/'")
    kind, sep, name = qualified.partition("=")
    if not sep:
        raise InvalidNameError(
            "qualified device name", qualified, "should be vendor/class=name (missing '=')"
        )
    vendor, slash, cls = kind.partition("/")
    if not slash or not vendor:
        raise InvalidNameError(
            "qualified device name", qualified, "should be vendor/class=name (missing vendor)"
        )
    validate_vendor(vendor)
    validate_class(cls)
    validate_device_name(name)
    return vendor, cls, name


def qualified_name(vendor: str, cls: str, name: str) -> str:
    """Return ``vendor/class=name`` after validating every part."""
    validate_vendor(vendor)
    validate_class(cls)
    validate_device_name(name)
    return f"{vendor}/{cls}={name}"


def is_k8s_qualified_name(name: str) -> bool:
    """Whether ``name`` is a Kubernetes qualified name (no prefix): 1-63 characters of
    ``A-Z a-z 0-9 - _ .``, starting and ending with a letter or digit.

    The one grammar of annotation names (the part after any ``prefix/``) and of the name part
    of extended resource names.
    """
    return len(name) <= MAX_SEGMENT_LEN and _QUALIFIED_NAME_RE.fullmatch(name) is not None


def is_dns_subdomain(text: str) -> bool:
    """Whether ``text`` is a lowercase DNS subdomain of at most 253 characters (RFC 1123)."""
    return len(text) <= MAX_VENDOR_LEN and _DNS_SUBDOMAIN_RE.fullmatch(text) is not None


def validate_resource_name(resource: str) -> None:
    """Raise unless ``resource`` is a Kubernetes extended resource name (IsExtendedResourceName).

    It must be ``domain/name`` with a lowercase DNS-subdomain domain, must not be a native
    (``kubernetes.io/``) resource and must not start with ``requests.``.
    """
    kind = "extended resource name"
    if "/" not in resource:
        raise InvalidNameError(kind, resource, "should be domain/name")
    if "kubernetes.io/" in resource:
        raise InvalidNameError(kind, resource, "'kubernetes.io/' names are reserved for Kubernetes")
    if resource.startswith("requests."):
        raise InvalidNameError(kind, resource, "must not start with 'requests.'")
    domain, _, name = resource.partition("/")
    if "/" in name:
        raise InvalidNameError(kind, resource, "should contain exactly one '/'")
    if not _DNS_SUBDOMAIN_RE.fullmatch(domain):
        raise InvalidNameError(
            kind,
            resource,
            f"domain {quote(domain)} should be a lowercase DNS subdomain (a-z 0-9 - .)",
        )
    if len(domain) > MAX_RESOURCE_DOMAIN_LEN:
        raise InvalidNameError(
            kind, resource, f"domain longer than {MAX_RESOURCE_DOMAIN_LEN} characters"
        )
    if not is_k8s_qualified_name(name):
        raise InvalidNameError(
            kind,
            resource,
            f"name {quote(name)} should be 1-63 characters of A-Z a-z 0-9 - _ . "
            "starting and ending alphanumeric",
        )


def validate_cdi_kind_as_resource(vendor: str, cls: str) -> str:
    """Validate ``vendor/class`` under both the CDI and the Kubernetes grammar; return it."""
    kind = build_kind(vendor, cls)
    validate_resource_name(kind)
    return kind


#: A DNS label (RFC 1123): what a ResourceSlice device name must be.
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
MAX_DNS_LABEL_LEN = 63
_NOT_LABEL_RE = re.compile(r"[^a-z0-9-]+")
#: Base32 characters of SHA-256 in a hashed label: 80 bits, so that distinct inputs (even
#: chosen ones: device names come from whoever plugs a device in) do not meet by chance.
HASH_CHARS = 16
#: What separates a hashed label's readable part from its hash. A label kept as it is never
#: contains it, so a kept label and a hashed one are never equal.
HASH_SEPARATOR = "--"
#: Longest DRA driver name (DriverNameMaxLength: a CSI driver name's limit), a DNS subdomain.
MAX_DRIVER_NAME_LEN = 63


def is_dns_label(text: str) -> bool:
    """Whether ``text`` is a DNS label: 1-63 of ``a-z 0-9 -``, alphanumeric at both ends."""
    return len(text) <= MAX_DNS_LABEL_LEN and _DNS_LABEL_RE.fullmatch(text) is not None


#: A Kubernetes UID as the API validates a DRA allocation's ``shareID`` (``format=k8s-uuid``:
#: apimachinery's ``validate.UUID``): the form alone, any UUID version.
_K8S_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: That rule in words, for refusals.
K8S_UUID_RULE = "a lowercase UUID in 8-4-4-4-12 form (36 characters of 0-9, a-f and '-')"


def is_k8s_uuid(text: str) -> bool:
    """Whether ``text`` is a UID the API accepts as a share ID (see :data:`K8S_UUID_RULE`)."""
    return _K8S_UUID_RE.fullmatch(text) is not None


def is_kept_label(text: str) -> bool:
    """Whether :func:`dns_label` keeps ``text`` as it is: a DNS label without ``--``."""
    return is_dns_label(text) and HASH_SEPARATOR not in text


def hashed_label(readable: str, key: bytes) -> str:
    """A DNS label for ``key``: ``readable`` lower-cased, every run of other characters made
    ``-``, cut to fit, then ``--`` and 16 base32 characters of the SHA-256 of ``key``.

    Two keys give two labels unless SHA-256 collides in 80 bits; a hashed label is never one
    that :func:`is_kept_label` accepts, so names kept as they are and hashed names never meet.
    The caller chooses ``key`` so that it tells its inputs apart (no ambiguous joining).
    """
    digest = base64.b32encode(hashlib.sha256(key).digest()).decode("ascii").lower()
    text = _NOT_LABEL_RE.sub("-", readable.lower()).strip("-")
    text = text[: MAX_DNS_LABEL_LEN - HASH_CHARS - len(HASH_SEPARATOR)].rstrip("-")
    return f"{text or 'x'}{HASH_SEPARATOR}{digest[:HASH_CHARS]}"


def dns_label(text: str) -> str:
    """``text`` as a DNS label: itself when it is one without ``--``, else a readable form
    plus a hash of ``text`` (:func:`hashed_label`).

    The hash keeps two names that differ only in what was replaced (``fpga_0`` and
    ``fpga.0``, ``A`` and ``a``) apart, and a hashed form never equals a name kept as it is.
    The same ``text`` always gives the same label, so a name is stable across restarts.
    """
    if is_kept_label(text):
        return text
    return hashed_label(text, text.encode("utf-8", "surrogatepass"))


def validate_driver_name(name: str) -> None:
    """Raise :class:`InvalidNameError` unless ``name`` is a DRA driver name the API server
    accepts in a ResourceSlice: a lowercase DNS subdomain of at most 63 characters."""
    if not is_dns_subdomain(name):
        raise InvalidNameError(
            "DRA driver name",
            name,
            "must be a lowercase DNS subdomain (a-z 0-9 - .), at most "
            f"{MAX_DRIVER_NAME_LEN} characters",
        )
    if len(name) > MAX_DRIVER_NAME_LEN:
        raise InvalidNameError(
            "DRA driver name",
            name,
            f"longer than {MAX_DRIVER_NAME_LEN} characters (the API server's limit, as for "
            "a CSI driver)",
        )
