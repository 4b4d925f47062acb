"""Kubernetes' own validation rules, applied before render and before submit: what the API server refuses
is refused here, with the params key, before anything is sent.

The OpenAPI schemas (and the CRDs' openAPIV3Schema, which the tests check every rendering against)
say a name is a string; the API server then applies apimachinery's rules: a namespace is a DNS-1123
label, an object name a DNS-1123 subdomain, a label key a qualified name, a label value at most 63
characters of a restricted alphabet, a quantity `resource.Quantity`'s grammar, and the pod spec's
enums (imagePullPolicy, a toleration's operator and effect). These are ports of
k8s.io/apimachinery/pkg/util/validation (IsDNS1123Label, IsDNS1123Subdomain, IsQualifiedName,
IsValidLabelValue, IsConfigMapKey, IsEnvVarName) and of the pod checks of
k8s.io/kubernetes/pkg/apis/core/validation.

`check_launch` judges launch's keys one by one, so its message names the key to fix; `check_objects`
then walks every rendered object (names, labels, annotations, pod specs), a backstop for whatever a
backend put there that no key names.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from voxpipe.errors import StepError
from voxpipe.steps.launch import QUANTITY, LaunchParams

DNS1123_LABEL_MAX, DNS1123_SUBDOMAIN_MAX, QUALIFIED_NAME_MAX, LABEL_VALUE_MAX = 63, 253, 63, 63
# the CRDs' own limit on a referenced runtime's name (TrainJob spec.runtimeRef.name maxLength)
RUNTIME_NAME_MAX = 253
GENERATED_SUFFIX = "x" * 5  # generateName gets five random characters appended
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_CONFIG_MAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_ENV_VAR_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")
_QUOTED = 80


def quoted(value: Any) -> str:
    """A user value for a message: repr'd, at most ~80 characters of it."""
    text = repr(value)
    return text if len(text) <= _QUOTED else f"{text[:_QUOTED - 3]}... ({len(str(value))} characters)"


# -- the rules: None when valid, else what is wrong (a clause) ---------------------------------------------
def dns1123_label(value: str) -> str | None:
    if len(value) > DNS1123_LABEL_MAX:
        return f"is {len(value)} characters long; a DNS-1123 label has at most {DNS1123_LABEL_MAX}"
    if not _DNS_LABEL.match(value):
        return ("is not a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a "
                "letter or digit")
    return None


def dns1123_subdomain(value: str, limit: int = DNS1123_SUBDOMAIN_MAX) -> str | None:
    if len(value) > limit:
        return f"is {len(value)} characters long; a DNS-1123 subdomain has at most {limit}"
    if not _DNS_SUBDOMAIN.match(value):
        return ("is not a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', each dot-separated "
                "part starting and ending with a letter or digit")
    return None


def qualified_name(value: str) -> str | None:
    """A label, annotation or resource key: an optional DNS-subdomain prefix and '/', then a name."""
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or dns1123_subdomain(prefix)):
        return (f"has the prefix {quoted(prefix)}, which is not a DNS-1123 subdomain (lowercase letters, "
                "digits, '-' and '.', at most 253 characters)")
    if len(name) > QUALIFIED_NAME_MAX:
        return f"has a name part of {len(name)} characters; a qualified name's has at most " \
               f"{QUALIFIED_NAME_MAX}"
    if not _QUALIFIED_NAME.match(name):
        return ("is not a qualified name ([prefix/]name, the name of letters, digits, '-', '_' and '.', "
                "starting and ending with a letter or digit)")
    return None


def label_value(value: str) -> str | None:
    if len(value) > LABEL_VALUE_MAX:
        return f"is {len(value)} characters long; a label value has at most {LABEL_VALUE_MAX}"
    if not _LABEL_VALUE.match(value):
        return ("is not a label value: empty, or letters, digits, '-', '_' and '.', starting and ending with "
                "a letter or digit")
    return None


def quantity(value: str) -> str | None:
    if not isinstance(value, str) or not value or not QUANTITY.match(value):
        return ("is not a Kubernetes quantity: a non-negative number with an optional suffix Ki, Mi, Gi, Ti, "
                "Pi, Ei, n, u, m, k, M, G, T, P, E or an exponent (e.g. 512Gi, 500m, 32)")
    return None


def one_of(value: Any, allowed: tuple[str, ...]) -> str | None:
    return None if value in allowed else f"is not one of {', '.join(allowed)}"


def env_var_name(value: str) -> str | None:
    if not _ENV_VAR_NAME.match(value):
        return ("is not an environment variable name (letters, digits, '_', '-' and '.', not starting with "
                "a digit)")
    return None


def config_map_key(value: str) -> str | None:
    if len(value) > DNS1123_SUBDOMAIN_MAX or value in (".", "..") or not _CONFIG_MAP_KEY.match(value):
        return "is not a Secret key (at most 253 letters, digits, '-', '_' and '.'; not '.' or '..')"
    return None


def resource_name(value: str) -> str | None:
    """A device resource (an extended resource): a qualified name with a domain prefix."""
    if "/" not in value:
        return "is not an extended resource name: it needs a domain prefix, as in nvidia.com/gpu"
    return qualified_name(value)


def refuse(key: str, value: Any, problem: str | None, hint: str) -> None:
    """The one-paragraph error for `key` when a rule found a `problem`."""
    if problem:
        raise StepError(f"{key}={quoted(value)} {problem}; the Kubernetes API server would refuse the job. "
                        f"{hint}")


# -- launch's keys -------------------------------------------------------------------------------------------
def check_launch(launch: LaunchParams, namespace: str) -> None:
    """Every launch key that reaches a rendered object, by Kubernetes' rule for where it lands."""
    key = "launch.namespace" if launch.namespace else "the namespace (launch.namespace empty)"
    refuse(key, namespace, dns1123_label(namespace),
           "Set launch.namespace to an existing namespace, e.g. ml, or leave it empty for the launcher "
           "pod's own.")
    refuse("launch.queue", launch.queue, dns1123_label(launch.queue),
           "Set launch.queue to the name of a Volcano queue (manifests/queue.yaml), e.g. voxpipe.")
    if launch.runtime:
        refuse("launch.runtime", launch.runtime, dns1123_subdomain(launch.runtime, RUNTIME_NAME_MAX),
               "Set it to the name of an installed ClusterTrainingRuntime (`kubectl get "
               "clustertrainingruntimes`), or leave it empty for voxpipe's own runtime.")
    refuse("launch.pvc", launch.pvc, dns1123_subdomain(launch.pvc),
           "Set launch.pvc to the name of the workspace PersistentVolumeClaim, e.g. voxpipe-workspace.")
    image = launch.image
    refuse("launch.image", image, "is empty or has whitespace" if not image or image != image.strip()
           or any(c.isspace() for c in image) else None, "Set launch.image to an image reference.")
    refuse("launch.image_pull_policy", launch.image_pull_policy,
           one_of(launch.image_pull_policy, PULL_POLICIES), "Use Always, IfNotPresent or Never.")
    if launch.accelerator:
        refuse("launch.accelerator", launch.accelerator, resource_name(launch.accelerator),
               'Use the device plugin\'s resource, e.g. huawei.com/Ascend910 or nvidia.com/gpu ("" = CPU).')
    for name in ("cpu", "memory", "shm_size"):
        value = getattr(launch, name)
        if value or name == "shm_size":
            refuse(f"launch.{name}", value, quantity(value), "Write it as e.g. 64Gi, 512Gi, 500m or 32.")
    if not launch.mount_path.startswith("/") or ":" in launch.mount_path:
        refuse("launch.mount_path", launch.mount_path, "is not an absolute path without ':'",
               "Use an absolute path such as /workspace.")
    for name in launch.env:
        refuse(f"launch.env.{name}", name, env_var_name(name), "Rename the variable.")
    for label, value in launch.node_selector.items():
        refuse(f"launch.node_selector.{label}", label, qualified_name(label),
               "A node selector's key is a node label's key, e.g. accelerator-type or kubernetes.io/arch.")
        refuse(f"launch.node_selector.{label}", value, label_value(value) if isinstance(value, str)
               else "is not a string", "A node selector's value is a node label's value, e.g. module-910b-8.")
    for i, toleration in enumerate(launch.tolerations):
        check_toleration(f"launch.tolerations[{i}]", toleration)


def check_toleration(key: str, toleration: Any) -> None:
    """A toleration as the API server validates it (core/validation's validateTolerations)."""
    hint = ("A toleration is {key, operator: Exists|Equal, value, effect: NoSchedule|PreferNoSchedule|"
            "NoExecute, tolerationSeconds}, as in a pod spec (docs/cluster.md).")
    if not isinstance(toleration, dict):
        refuse(key, toleration, "is not a mapping", hint)
    unknown = sorted(str(k) for k in toleration if k not in TOLERATION_FIELDS)
    if unknown:
        refuse(f"{key}.{unknown[0]}", toleration[unknown[0]], "is not a toleration field", hint)
    operator = toleration.get("operator", "Equal")
    refuse(f"{key}.operator", operator, one_of(operator, TOLERATION_OPERATORS), hint)
    name = toleration.get("key", "")
    if not isinstance(name, str):
        refuse(f"{key}.key", name, "is not a string", hint)
    if name:
        refuse(f"{key}.key", name, qualified_name(name), hint)
    elif operator != "Exists":
        refuse(f"{key}.operator", operator, "must be Exists when the key is empty (tolerate every taint)",
               hint)
    value = toleration.get("value", "")
    if operator == "Exists" and value:
        refuse(f"{key}.value", value, "must be empty when the operator is Exists", hint)
    refuse(f"{key}.value", value, label_value(value) if isinstance(value, str) else "is not a string", hint)
    effect = toleration.get("effect", "")
    if effect:
        refuse(f"{key}.effect", effect, one_of(effect, TAINT_EFFECTS), hint)
    seconds = toleration.get("tolerationSeconds")
    if seconds is not None:
        if not isinstance(seconds, int) or isinstance(seconds, bool):
            refuse(f"{key}.tolerationSeconds", seconds, "is not a whole number of seconds", hint)
        if effect != "NoExecute":
            refuse(f"{key}.tolerationSeconds", seconds, "needs effect NoExecute", hint)


# -- every rendered object ----------------------------------------------------------------------------------
def check_objects(objects: list[dict[str, Any]], kind: str) -> None:
    """Every name, label, annotation and pod field of the rendered objects (`kind` names them in the
    message: "the Volcano job"); a backstop behind `check_launch`, naming the field's path."""
    for obj in objects:
        for where, value, problem in _object_problems(obj):
            refuse(f"{kind}'s {where}", value, problem,
                   "It comes from launch's params (docs/cluster.md); fix the value there.")


def _object_problems(obj: dict[str, Any]) -> Iterator[tuple[str, Any, str | None]]:
    meta = obj.get("metadata") or {}
    if "name" in meta:
        yield "metadata.name", meta["name"], dns1123_subdomain(meta["name"])
    if "generateName" in meta:
        yield "metadata.generateName", meta["generateName"], dns1123_subdomain(meta["generateName"]
                                                                              + GENERATED_SUFFIX)
    if "namespace" in meta:
        yield "metadata.namespace", meta["namespace"], dns1123_label(meta["namespace"])
    yield from _meta_maps(meta, "metadata")
    yield from _walk(obj.get("spec"), "spec")


def _meta_maps(meta: dict[str, Any], where: str) -> Iterator[tuple[str, Any, str | None]]:
    for label, value in (meta.get("labels") or {}).items():
        yield f"{where}.labels key", label, qualified_name(label)
        yield f"{where}.labels.{label}", value, label_value(value)
    for annotation in meta.get("annotations") or {}:
        yield f"{where}.annotations key", annotation, qualified_name(annotation)


def _walk(node: Any, where: str) -> Iterator[tuple[str, Any, str | None]]:
    """Pod specs (a dict with containers), templates' metadata and resource maps, wherever they sit."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, f"{where}[{i}]")
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("metadata"), dict):
        yield from _meta_maps(node["metadata"], f"{where}.metadata")
    if "containers" in node:
        yield from _pod_spec(node, where)
    for field in ("resources", "resourcesPerNode"):
        if isinstance(node.get(field), dict):
            yield from _resources(node[field], f"{where}.{field}")
    if isinstance(node.get("env"), list):
        yield from _env(node["env"], f"{where}.env")
    for key, value in node.items():
        if key not in ("metadata", "env", "resources", "resourcesPerNode"):
            yield from _walk(value, f"{where}.{key}")


def _pod_spec(spec: dict[str, Any], where: str) -> Iterator[tuple[str, Any, str | None]]:
    for i, c in enumerate(spec.get("containers") or []):
        yield f"{where}.containers[{i}].name", c.get("name", ""), dns1123_label(c.get("name", ""))
        if "imagePullPolicy" in c:
            yield (f"{where}.containers[{i}].imagePullPolicy", c["imagePullPolicy"],
                   one_of(c["imagePullPolicy"], PULL_POLICIES))
    for label, value in (spec.get("nodeSelector") or {}).items():
        yield f"{where}.nodeSelector key", label, qualified_name(label)
        yield f"{where}.nodeSelector.{label}", value, label_value(value)
    for i, toleration in enumerate(spec.get("tolerations") or []):
        for field, allowed in (("operator", TOLERATION_OPERATORS), ("effect", TAINT_EFFECTS)):
            if toleration.get(field):
                value = toleration[field]
                yield f"{where}.tolerations[{i}].{field}", value, one_of(value, allowed)
    for i, volume in enumerate(spec.get("volumes") or []):
        yield f"{where}.volumes[{i}].name", volume.get("name", ""), dns1123_label(volume.get("name", ""))
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim is not None:
            yield f"{where}.volumes[{i}].persistentVolumeClaim.claimName", claim, dns1123_subdomain(claim)
        size = (volume.get("emptyDir") or {}).get("sizeLimit")
        if size is not None:
            yield f"{where}.volumes[{i}].emptyDir.sizeLimit", size, quantity(size)


def _resources(resources: dict[str, Any], where: str) -> Iterator[tuple[str, Any, str | None]]:
    for section in ("requests", "limits"):
        for name, value in (resources.get(section) or {}).items():
            yield f"{where}.{section} key", name, qualified_name(name)
            yield f"{where}.{section}.{name}", value, quantity(str(value)) if isinstance(value, int | str) \
                else "is not a quantity"


def _env(env: list[dict[str, Any]], where: str) -> Iterator[tuple[str, Any, str | None]]:
    for i, entry in enumerate(env):
        yield f"{where}[{i}].name", entry.get("name", ""), env_var_name(entry.get("name", ""))
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            yield f"{where}[{i}].valueFrom.secretKeyRef.name", ref.get("name", ""), \
                dns1123_subdomain(ref.get("name", ""))
            yield f"{where}[{i}].valueFrom.secretKeyRef.key", ref.get("key", ""), \
                config_map_key(ref.get("key", ""))
