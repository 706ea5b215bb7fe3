"""Validation of PrefixServing and ScalingPolicy bodies, with a field path and a hint per problem.

Two layers:
1. The pydantic models (types, ranges, enums, unknown fields), the same constraints the CRD
   schema carries.
2. ``RULES``: cross-field rules. Each has a Python check and, when it can be expressed, a CEL
   expression that ``api/crd.py`` emits as ``x-kubernetes-validations`` on the same object, so
   the API server refuses what ``prefixserving validate`` refuses. Rules without CEL run in
   Python only, at ``prefixserving validate`` and at reconcile time: quantity comparisons, and
   checks on int-or-string quantities (CEL sees those as ``dyn`` of unbounded size, and the
   API server refuses a CRD whose rule cost it cannot bound).

CEL cost: every string a rule reads has a ``maxLength`` and every list a ``maxItems``, so the
API server's static cost estimate stays far below its per-rule limit (10M): the costliest
rule, ``extraArgs``, is about 64 items x 102 x 73 (string x regex length factors) = 0.5M.

Every problem is reported, not just the first; cost is linear in the size of the body.
"""

from __future__ import annotations

import re
import types as pytypes
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity
from pydantic import BaseModel, ValidationError

from prefixserving import constants
from prefixserving.api import types as t

# Flags the operator sets on the engine; extraArgs may not repeat them (vLLM takes the last
# occurrence, so a repeated flag would silently override the spec). vLLM accepts '_' for '-'.
OWNED_FLAGS: tuple[str, ...] = (
    "model",
    "served-model-name",
    "port",
    "host",
    "tensor-parallel-size",
    "gpu-memory-utilization",
    "block-size",
    "max-model-len",
    "enable-prefix-caching",
    "no-enable-prefix-caching",
    "scheduler-cls",
    "async-scheduling",
    "no-async-scheduling",
    "enable-lora",
    "lora-modules",
    "max-loras",
    "numa-bind",
    "revision",
)
# Environment variables the operator sets on the engine (spec.engine.env may not repeat them:
# the kubelet keeps the last duplicate, which would silently override the spec).
OWNED_ENV: tuple[str, ...] = (
    constants.ENV_MAX_SIBLING_WAIT_MS,
    constants.ENV_PIN_BUDGET_FRACTION,
    constants.ENV_LANES,
    constants.ENV_MAX_OVERTAKES,
    constants.ENV_DECODE_RESERVE_BLOCKS,
    "HF_HOME",
    "HF_TOKEN",
)


def flag_pattern(flags: tuple[str, ...]) -> str:
    """A regular expression (Python's and CEL's alike) for an argument that sets one of
    ``flags`` (named without dashes): ``--flag``, ``-flag`` or ``--flag=value``, with '_' for
    '-' as vLLM accepts."""
    return "^(--|-)(" + "|".join(flag.replace("-", "[-_]") for flag in flags) + ")(=.*)?$"


OWNED_FLAG_RE = flag_pattern(OWNED_FLAGS)
_OWNED = re.compile(OWNED_FLAG_RE)

# Upper bounds that catch typos ("64Ti" for "64Gi") before the scheduler does.
MAX_SHM_BYTES = parse_quantity("1Ti")
MAX_MEMORY_BYTES = parse_quantity("16Ti")
MAX_CPU = Decimal(1024)


@dataclass(frozen=True)
class Problem:
    """One reason a resource is invalid: where, what, and how to fix it."""

    path: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


class SpecError(ValueError):
    """A resource failed validation; ``problems`` lists every reason."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


@dataclass(frozen=True)
class Rule:
    """A cross-field rule on one model.

    ``check`` returns None when the object is valid and a message when not. ``cel`` (None when
    it cannot be expressed in CEL) must accept exactly what ``check`` accepts; its message is
    ``message``. ``field`` is the camelCase field the problem is reported on ("" for the object).
    """

    model: type[BaseModel]
    field: str
    message: str
    hint: str
    check: Callable[[Any], str | None]
    cel: str | None = None


def _exactly_one(a: object, b: object, message: str) -> str | None:
    return None if (a is None) != (b is None) else message


def _min_le_max(p: t.ScalingParameters) -> str | None:
    low, high = p.min_replicas, p.max_replicas
    if low is not None and high is not None and low > high:
        return f"minReplicas ({low}) is greater than maxReplicas ({high})"
    return None


def _zero_needs_keda(p: t.ScalingParameters) -> str | None:
    if p.min_replicas == 0 and p.backend == "hpa":
        return "minReplicas 0 needs backend keda (an HPA cannot scale to zero)"
    return None


def _owned_args(engine: t.EngineSpec) -> str | None:
    owned = [arg for arg in engine.extra_args if _OWNED.match(arg)]
    if owned:
        verb = "is" if len(owned) == 1 else "are"
        return f"{', '.join(owned)} {verb} set by the operator from the spec; remove from extraArgs"
    return None


def _owned_env(engine: t.EngineSpec) -> str | None:
    owned = [e.name for e in engine.env if e.name in OWNED_ENV]
    if owned:
        return f"{', '.join(owned)} set by the operator from the spec; remove from env"
    return None


# What router.kvEvents sets on the engines, so that routers recompute the engines' hashes.
KV_EVENTS_FLAGS: tuple[str, ...] = ("kv-events-config", "prefix-caching-hash-algo")
# vLLM seeds its block hashes with PYTHONHASHSEED when set; routers use vLLM's default seed.
HASH_SEED_ENV = "PYTHONHASHSEED"
# Engine flags that change the tokens of a request; routers under router.kvEvents tokenize with
# the model's own tokenizer and chat template (the model's --revision on the Hub).
TOKENIZER_FLAGS: tuple[str, ...] = (
    "tokenizer",
    "tokenizer-revision",
    "tokenizer-mode",
    "chat-template",
    "chat-template-content-format",
)
# Data-parallel ranks each publish their events on the event port plus their rank (rank 1 on
# the replay port); routers follow one publisher per engine pod. vLLM's long and short names.
DATA_PARALLEL_FLAGS: tuple[str, ...] = (
    "data-parallel-size",
    "dp",
    "data-parallel-size-local",
    "dpl",
    "data-parallel-rank",
    "dpn",
    "data-parallel-start-rank",
    "dpr",
)
KV_EVENTS_OFF_CEL = (
    "!has(self.router) || !has(self.router.kvEvents)"
    " || !has(self.router.kvEvents.enabled) || !self.router.kvEvents.enabled"
)


def _no_extra_arg_cel(pattern: str) -> str:
    """CEL: no engine.extraArgs item matches ``pattern`` (on a PrefixServingSpec)."""
    return (
        "(!has(self.engine) || !has(self.engine.extraArgs)"
        f" || self.engine.extraArgs.all(a, !a.matches('{pattern}')))"
    )


def _integer_cpu(spec: t.PrefixServingSpec) -> str | None:
    cpu = spec.engine.resources.cpu
    if spec.placement.numa == "aligned" and not re.fullmatch(r"[1-9][0-9]*", cpu):
        return f"numa: aligned needs a whole number of CPUs, got {cpu!r}"
    return None


def _bytes(quantity: str) -> Decimal:
    return Decimal(parse_quantity(quantity))


def _shm_fits(spec: t.PrefixServingSpec) -> str | None:
    shm, memory = spec.placement.shm.size_limit, spec.engine.resources.memory
    if _bytes(shm) >= _bytes(memory):
        return f"/dev/shm ({shm}) must be smaller than the engine's memory ({memory})"
    return None


def _sane_engine_resources(engine: t.EngineSpec) -> str | None:
    cpu, memory = engine.resources.cpu, engine.resources.memory
    if not Decimal(0) < _bytes(cpu) <= MAX_CPU:
        return f"cpu {cpu!r} must be above 0 and at most {MAX_CPU}"
    if not Decimal(0) < _bytes(memory) <= MAX_MEMORY_BYTES:
        return f"memory {memory!r} must be above 0 and at most 16Ti"
    return None


def _sane_shm(shm: t.ShmSpec) -> str | None:
    if not Decimal(0) < _bytes(shm.size_limit) <= MAX_SHM_BYTES:
        return f"sizeLimit {shm.size_limit!r} must be above 0 and at most 1Ti"
    return None


def _unique_adapters(model: t.ModelSpec) -> str | None:
    names = [a.name for a in model.adapters]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        return f"adapter names must be unique: {', '.join(duplicates)} repeated"
    if model.served_name in names:
        return f"adapter {model.served_name!r} has the served model's name"
    return None


def _max_loras(model: t.ModelSpec) -> str | None:
    if model.max_loras is not None and model.max_loras > len(model.adapters):
        count = len(model.adapters)
        return f"maxLoras ({model.max_loras}) exceeds the number of adapters ({count})"
    return None


def _replicas_vs_autoscaling(spec: t.PrefixServingSpec) -> str | None:
    if spec.replicas is not None and spec.autoscaling.enabled:
        return "replicas is set while autoscaling is enabled; the autoscaler owns the count"
    return None


def _prompts_or_configmap(warmup: t.WarmupSpec) -> str | None:
    if warmup.prompts and warmup.config_map_ref is not None:
        return "set prompts or configMapRef, not both"
    return None


def _refused_with_kv_events(
    flags: tuple[str, ...], message: str, hint: str, reason: str, env: str | None = None
) -> Rule:
    """The rule that refuses engine.extraArgs setting one of ``flags`` (or engine.env setting
    ``env``) while router.kvEvents is on; the problem names what is set and ``reason``."""
    pattern = flag_pattern(flags)
    matches = re.compile(pattern).match

    def check(spec: t.PrefixServingSpec) -> str | None:
        if not spec.router.kv_events.enabled:
            return None
        found = [arg for arg in spec.engine.extra_args if matches(arg)]
        found += [e.name for e in spec.engine.env if env is not None and e.name == env]
        return f"{', '.join(found)} set: {reason}" if found else None

    allowed = _no_extra_arg_cel(pattern)
    if env is not None:
        no_env = (
            "!has(self.engine) || !has(self.engine.env)"
            f" || self.engine.env.all(e, e.name != '{env}')"
        )
        allowed = f"({allowed} && ({no_env}))"
    return Rule(
        model=t.PrefixServingSpec,
        field="router.kvEvents.enabled",
        message=message,
        hint=hint,
        check=check,
        cel=f"{KV_EVENTS_OFF_CEL} || {allowed}",
    )


ONE_SOURCE = "set exactly one of pvc and huggingFace"
ONE_PROMPT = "set exactly one of prompt and messages"

RULES: tuple[Rule, ...] = (
    Rule(
        model=t.ModelSource,
        field="",
        message=ONE_SOURCE,
        hint="e.g. source: {huggingFace: {repo: Qwen/Qwen2.5-7B-Instruct}}",
        check=lambda s: _exactly_one(s.pvc, s.hugging_face, ONE_SOURCE),
        cel="has(self.pvc) != has(self.huggingFace)",
    ),
    Rule(
        model=t.ModelSpec,
        field="adapters",
        message="adapter names must be unique and differ from servedName",
        hint="rename the adapter; clients select it by this name",
        check=_unique_adapters,
        cel=(
            "!has(self.adapters) || self.adapters.all(a, a.name != self.servedName"
            " && self.adapters.exists_one(b, b.name == a.name))"
        ),
    ),
    Rule(
        model=t.ModelSpec,
        field="maxLoras",
        message="maxLoras cannot exceed the number of adapters",
        hint="remove maxLoras or add adapters",
        check=_max_loras,
        cel="!has(self.maxLoras) || (has(self.adapters) && self.maxLoras <= size(self.adapters))",
    ),
    Rule(
        model=t.EngineSpec,
        field="extraArgs",
        message="extraArgs may not set a flag the operator owns",
        hint="use the spec field instead (model.*, engine.*, scheduler.*); owned: "
        + ", ".join(f"--{f}" for f in OWNED_FLAGS),
        check=_owned_args,
        cel=f"!has(self.extraArgs) || self.extraArgs.all(a, !a.matches('{OWNED_FLAG_RE}'))",
    ),
    Rule(
        model=t.EngineSpec,
        field="env",
        message="env may not set a variable the operator owns",
        hint="set them through scheduler.* and model.source.huggingFace; owned: "
        + ", ".join(OWNED_ENV),
        check=_owned_env,
        cel="!has(self.env) || self.env.all(e, !(e.name in ["
        + ", ".join(f"'{name}'" for name in OWNED_ENV)
        + "]))",
    ),
    Rule(
        model=t.EngineSpec,
        field="resources",
        message="cpu and memory must be positive and plausible",
        hint="e.g. resources: {cpu: '8', memory: 64Gi}",
        check=_sane_engine_resources,
    ),
    Rule(
        model=t.ShmSpec,
        field="sizeLimit",
        message="sizeLimit must be positive and at most 1Ti",
        hint="16Gi to 64Gi is typical for tensor parallelism",
        check=_sane_shm,
    ),
    Rule(
        model=t.ScalingParameters,
        field="maxReplicas",
        message="minReplicas must not exceed maxReplicas",
        hint="raise maxReplicas or lower minReplicas",
        check=_min_le_max,
        cel=(
            "!has(self.minReplicas) || !has(self.maxReplicas)"
            " || self.minReplicas <= self.maxReplicas"
        ),
    ),
    Rule(
        model=t.ScalingParameters,
        field="minReplicas",
        message="minReplicas 0 needs backend keda (an HPA cannot scale to zero)",
        hint="set backend: keda, or minReplicas: 1",
        check=_zero_needs_keda,
        cel=(
            "!has(self.minReplicas) || !has(self.backend)"
            " || self.minReplicas > 0 || self.backend != 'hpa'"
        ),
    ),
    Rule(
        model=t.WarmupPrompt,
        field="",
        message=ONE_PROMPT,
        hint="e.g. {prompt: 'You are a support agent...'} or {messages: [{role: system, ...}]}",
        check=lambda p: _exactly_one(p.prompt, p.messages, ONE_PROMPT),
        cel="has(self.prompt) != has(self.messages)",
    ),
    Rule(
        model=t.WarmupSpec,
        field="configMapRef",
        message="set prompts or configMapRef, not both",
        hint="move the inline prompts into the ConfigMap, or drop configMapRef",
        check=_prompts_or_configmap,
        cel="!has(self.configMapRef) || !has(self.prompts) || size(self.prompts) == 0",
    ),
    Rule(
        model=t.PrefixServingSpec,
        field="replicas",
        message="replicas must be unset while autoscaling is enabled",
        hint="remove spec.replicas, or set autoscaling.minReplicas/maxReplicas",
        check=_replicas_vs_autoscaling,
        cel=(
            "!has(self.replicas) || !has(self.autoscaling) || !has(self.autoscaling.enabled)"
            " || !self.autoscaling.enabled"
        ),
    ),
    _refused_with_kv_events(
        KV_EVENTS_FLAGS,
        message="router.kvEvents sets the engines' KV event flags and block hash",
        hint="remove --kv-events-config, --prefix-caching-hash-algo from engine.extraArgs and "
        f"{HASH_SEED_ENV} from engine.env, or set router.kvEvents.enabled: false",
        reason="router.kvEvents needs the operator's settings",
        env=HASH_SEED_ENV,
    ),
    _refused_with_kv_events(
        TOKENIZER_FLAGS,
        message="router.kvEvents needs the engines' default tokenizer and chat template",
        hint="remove "
        + ", ".join(f"--{f}" for f in TOKENIZER_FLAGS)
        + " from engine.extraArgs, or set router.kvEvents.enabled: false",
        reason="router.kvEvents tokenizes requests with the model's own tokenizer and chat "
        "template, so its block hashes would differ from the engines'",
    ),
    _refused_with_kv_events(
        DATA_PARALLEL_FLAGS,
        message="router.kvEvents needs one data-parallel rank per engine pod",
        hint="remove --data-parallel-size (-dp), --data-parallel-size-local (-dpl), "
        "--data-parallel-rank (-dpn) and --data-parallel-start-rank (-dpr) from "
        "engine.extraArgs and scale with replicas, or set router.kvEvents.enabled: false",
        reason="with router.kvEvents each engine pod runs one data-parallel rank (each rank "
        "publishes its events on its own port)",
    ),
    Rule(
        model=t.PrefixServingSpec,
        field="engine.resources.cpu",
        message="numa: aligned needs a whole number of CPUs",
        hint="set engine.resources.cpu to an integer such as '16'",
        check=_integer_cpu,
    ),
    Rule(
        model=t.PrefixServingSpec,
        field="placement.shm.sizeLimit",
        message="/dev/shm must be smaller than the engine's memory",
        hint="raise engine.resources.memory or lower placement.shm.sizeLimit",
        check=_shm_fits,
    ),
)


def rules_for(model: type[BaseModel]) -> list[Rule]:
    """The rules that apply to ``model`` (declared on it or a base class), in declaration order."""
    return [rule for rule in RULES if issubclass(model, rule.model)]


def _walk(obj: BaseModel, path: str) -> Iterator[tuple[BaseModel, str]]:
    """Every model in the tree under ``obj`` with its camelCase path, parents first."""
    yield obj, path
    for name, info in type(obj).model_fields.items():
        value = getattr(obj, name)
        child = f"{path}.{info.alias or name}" if path else (info.alias or name)
        if isinstance(value, BaseModel):
            yield from _walk(value, child)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _walk(item, f"{child}[{i}]")


def check_rules(obj: BaseModel, path: str = "") -> list[Problem]:
    """Run every cross-field rule that applies to a model in the tree under ``obj``."""
    problems = []
    for node, node_path in _walk(obj, path):
        for rule in RULES:
            if isinstance(node, rule.model):
                message = rule.check(node)
                if message is not None:
                    where = ".".join(p for p in (node_path, rule.field) if p)
                    problems.append(Problem(where, message, rule.hint))
    return problems


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as ``X | None`` or ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated or origin in (typing.Union, pytypes.UnionType, list, dict):
        for arg in typing.get_args(annotation):
            found = model_in(arg)
            if found is not None:
                return found
    return None


def _fields_by_alias(model: type[BaseModel]) -> dict[str, Any]:
    return {info.alias or name: info for name, info in model.model_fields.items()}


def _hint(root: type[BaseModel], loc: tuple[str | int, ...], error_type: str) -> str:
    """A hint from the schema: the known fields for an unknown one, else the field's help."""
    model: type[BaseModel] | None = root
    info = None
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        info = _fields_by_alias(model).get(part)
        if info is None:
            if error_type == "extra_forbidden":
                return "known fields here: " + ", ".join(sorted(_fields_by_alias(model)))
            return ""
        model = model_in(info.annotation)
    if error_type == "extra_forbidden":
        return "remove it"
    return info.description or "" if info is not None else ""


def _path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            continue  # pydantic's union/validator tags, e.g. "function-after[...]"
        else:
            out += f".{part}" if out else part
    return out


def _problems(error: ValidationError, root: type[BaseModel]) -> list[Problem]:
    problems = []
    for e in error.errors():
        loc = tuple(p for p in e["loc"] if isinstance(p, int) or not p.startswith("function-"))
        message = e["msg"]
        if e["type"] == "extra_forbidden":
            message = "unknown field"
        problems.append(Problem(_path(loc) or "(root)", message, _hint(root, loc, e["type"])))
    return problems


def _parse(body: Mapping[str, Any], model: type[BaseModel]) -> Any:
    if not isinstance(body, Mapping):
        raise SpecError([Problem("(root)", "expected a mapping", "pass one YAML document")])
    try:
        obj = model.model_validate(dict(body))
    except ValidationError as error:
        raise SpecError(_problems(error, model)) from None
    problems = check_rules(obj)
    if problems:
        raise SpecError(problems)
    return obj


def parse_resource(body: Mapping[str, Any]) -> t.PrefixServing:
    """Validate a PrefixServing body (a dict as the API server or a YAML file gives it).

    Raises SpecError listing every problem with its field path and a hint.
    """
    result: t.PrefixServing = _parse(body, t.PrefixServing)
    return result


def parse_scaling_policy(body: Mapping[str, Any]) -> t.ScalingPolicy:
    """Validate a ScalingPolicy body; raises SpecError like ``parse_resource``."""
    result: t.ScalingPolicy = _parse(body, t.ScalingPolicy)
    return result
