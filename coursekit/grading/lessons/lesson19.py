"""Graded items of lesson 19, "Capstone: the QLoRA run you build and judge".

The student's functions are checked on a tiny random Llama checkpoint (coursekit.model.tiny_checkpoint: the
course model's architecture, 2 layers of width 64, loaded in NF4 by bitsandbytes in well under a second),
never on the real model and never by training the real run: a check costs seconds. Each model item runs the
student's function on prepared cases (a healthy model, and models broken in one known way) and compares
what comes back with coursekit's reference; a case fails with the mistake named when the outcome matches a
known wrong variant.
"""

from __future__ import annotations

import atexit
import copy
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ... import capstone, cheap, evaluate as ceval, model as cmodel, paired, train as ctrain
from ...data import IGNORE_INDEX, LABELS
from .. import Choice, Function, Ordering
from ..checkers import (PUBLIC_ONLY_NOTE, Case, CaseTimeout, Feedback, Mistake, _CallWatch, _case_timeout, _consistent,
                        describe_exception, probe, quiet, time_limit, worded)

READ_RECIPE = "Reread 'Step 1: the recipe in four calls' in Practice, part 1."
READ_PREFLIGHT = "Reread 'Step 2: a preflight that can fail' in Practice, part 1."
READ_LOOP = "Reread 'Step 3: the training loop' in Practice, part 1."
READ_SCORING = "Reread 'Step 4: two ways to read a label' in Practice, part 1."
READ_MERGE = "Reread 'Step 5: save, reload, merge' in Practice, part 1."
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# --------------------------------------------------------------------------- the tiny checkpoints

_TINY_DIRS: dict[tuple, str] = {}


def tiny_path(seed: int = 0, layers: int = 2) -> Path:
    """A tiny random Llama checkpoint for this process (written once per (seed, layers) into the temporary folder,
    again if that folder has gone; removed at exit). Deterministic in ``seed``: the grader's runner writes its own,
    equal one."""
    key = (seed, layers)
    have = _TINY_DIRS.get(key)
    if have is None or not (Path(have) / "config.json").exists():
        have = tempfile.mkdtemp(prefix="coursekit-tiny-")
        with quiet([]):
            cmodel.tiny_checkpoint(have, seed=seed, num_hidden_layers=layers)
        _TINY_DIRS[key] = have
    return Path(have)


@atexit.register
def _remove_tiny_checkpoints() -> None:
    for d in _TINY_DIRS.values():
        shutil.rmtree(d, ignore_errors=True)


def tiny_batch(seed: int, rows: int = 2, length: int = 8, answer: int = 2, vocab: int = 96) -> dict[str, torch.Tensor]:
    """A collated batch of random token ids: the last ``answer`` positions of each row supervised, the rest -100."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (rows, length), generator=g)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, -answer:] = ids[:, -answer:]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _quiet_call(fn: Callable, *args, **kwargs):
    with quiet([]):
        return fn(*args, **kwargs)


# --------------------------------------------------------------------------- running the student's function


class _Stub(Exception):
    """The student's function (or one it calls) still raises NotImplementedError."""


_PKG = Path(__file__).resolve().parents[2]          # coursekit/
_ANSWER_CODE = (_PKG / "grading", _PKG / "capstone.py", _PKG / "recipe.py")  # answers, the pipeline, the model answers


def _borrowed(watch: _CallWatch, forbidden: tuple[Callable, ...], allowed: tuple[Callable, ...] = ()) -> list[str]:
    """coursekit functions the student's code ran, directly or through any wrapper, that it must not use: the item's
    references (``forbidden``) and anything in coursekit.grading, coursekit.capstone or coursekit.recipe (lesson
    19's model answers), except ``allowed`` (code the grader itself put into the case, such as a hook on a broken
    model)."""
    codes = {getattr(getattr(f, "__func__", f), "__code__", None): f"{f.__module__}.{f.__qualname__}" for f in forbidden}
    ok = {getattr(getattr(f, "__func__", f), "__code__", None) for f in allowed}
    found = set()
    for code in watch.all:
        if code in ok:
            continue
        if code in codes:
            found.add(codes[code])
        elif Path(code.co_filename).resolve().is_relative_to(_ANSWER_CODE[0]):
            found.add("the grader's own code")
        elif Path(code.co_filename).resolve() == _ANSWER_CODE[1]:
            found.add("coursekit.capstone's run")
        elif Path(code.co_filename).resolve() == _ANSWER_CODE[2]:
            found.add("coursekit.recipe (the reference recipe)")
    return sorted(found)


def _watched(fn: Callable, args: tuple, forbidden: tuple[Callable, ...], allowed: tuple[Callable, ...] = ()):
    """``fn(*args)`` under a watch on coursekit's answers: ``(result, [what it borrowed])``. Part of each measure,
    so it runs wherever the student's function runs: in the notebook while the student works (feedback), and in
    the grader's runner, where the item's ``withheld`` functions are stubs anyway (the enforcement)."""
    watch = _CallWatch()
    with watch():
        out = fn(*args)
    return out, _borrowed(watch, forbidden, allowed)


class _Unreadable(Exception):
    """What came back from the student's function is not the measurement the check asked for."""


def _call(fn: Callable, measure: Callable, args: tuple, name: str, tag: str, hidden: bool):
    """``measure(fn, *args)``: set up the case, run the student's function and read what it did as data (in the
    grader's sandboxed runner in the autograde run, see :func:`coursekit.grading.checkers.probe`), with output
    captured and a time limit. Returns ``(True, data)`` or ``(False, [feedback lines])``; raises :class:`_Stub`
    for NotImplementedError."""
    noise: list[str] = []
    limit = _case_timeout()
    try:
        with quiet(noise), time_limit(limit):
            out = probe(fn, measure, *args)
    except CaseTimeout:
        return False, [f"✗ {tag}: your {name} did not return within {limit:g} s and was stopped."]
    except NotImplementedError:
        raise _Stub()
    except (Exception, SystemExit) as e:  # the student's bug, reported (sys.exit included)
        return False, [f"✗ {tag}: " + describe_exception(e, name, {}, hidden=hidden)]
    if not isinstance(out, dict):
        raise _Unreadable(type(out).__name__)
    used = out.get("borrowed") or []
    if used:
        return False, [f"✗ {tag}: your {name} runs {', '.join(map(str, used))} instead of doing the work itself; a "
                       f"case passed that way earns nothing."]
    return True, out


@dataclass
class _ModelItem:
    """Shared scoring of the model items: each case is ``(label, run_case(fn, case, tag, hidden) -> (ok, lines))``.

    The check needs objects the student's function returns (a PEFT model, an optimizer): each item's measure
    (a module-level function, ``measure(fn, *case) -> dict``) builds the case, calls the function and reduces
    what it returned to data; the comparison with the reference happens here, in the grading process."""

    title: str
    points: float
    name: str
    preload = ("transformers", "peft", "bitsandbytes")  # imported by the grader's runner before its time limits start
    withheld = ()  # coursekit functions stubbed in the grader's runner while this item is graded
    watches_borrowing = True  # each measure watches what the student's function runs (_watched), in the notebook too

    def public(self) -> list:
        raise NotImplementedError

    def hidden(self, rng: np.random.Generator) -> list:
        return []

    def run_case(self, fn: Callable, case: Any, tag: str, hidden: bool) -> tuple:
        """``(ok, feedback lines)``, or for a failed case that made a known mistake ``(False, lines, labels)``
        (:func:`_named`): the labels go to :attr:`Feedback.mistakes`, the class report's data."""
        raise NotImplementedError

    def check(self, answer: Any, ctx: Any) -> Feedback:
        if not callable(answer):
            return Feedback(0, self.points, [f"{self.name} should be a function; got {type(answer).__name__}. "
                                             f"Define it with def {self.name}(...):"])
        cases = [(c, False) for c in self.public()]
        if ctx.hidden:
            cases += [(c, True) for c in self.hidden(ctx.rng())]
        passed, lines, seen, named = 0, [], {}, []
        for i, (case, hidden) in enumerate(cases, 1):
            tag = f"hidden case {i}" if hidden else f"public case {i} ({case.label})"
            saved = torch.get_rng_state()
            try:
                ok, msg, *labels = self.run_case(answer, case, tag, hidden)
                if not ok and labels and labels[0]:
                    named.append(list(labels[0]))
            except _Stub:
                return Feedback(0, self.points, [f"{self.name} still raises NotImplementedError: replace the stub "
                                                 f"with your code."])
            except (_Unreadable, KeyError, TypeError, ValueError, AttributeError) as e:  # a forged measurement
                ok, msg = False, [f"✗ {tag}: what came back from your {self.name} could not be read as the check's "
                                  f"measurement ({type(e).__name__}); nothing in it counts."]
            finally:
                torch.set_rng_state(saved)
            passed += ok
            head = msg[0].split(": ", 1)[-1] if msg else ""
            if hidden and not ok and head in seen:
                lines.append(f"✗ {tag}: the same mistake as {seen[head]}.")
                continue
            if not ok:
                seen.setdefault(head, tag)
            lines += msg
        if not ctx.hidden:
            lines.append(PUBLIC_ONLY_NOTE)
        return Feedback(self.points * passed / len(cases), self.points, lines, mistakes=_consistent(named))


def _named(tag: str, problems: list[tuple[str, str]], shown: int | None = None) -> tuple[bool, list[str], list[str]]:
    """A failed case from its known mistakes, ``[(label, sentence), ...]``, the first the main one: the feedback
    lines (the first sentence, then the others, at most ``shown`` in all, as "also") and every label (for
    :attr:`Feedback.mistakes`)."""
    return (False, [f"✗ {tag}: {problems[0][1]}"] + [f"    also: {text}" for _, text in problems[1:shown]],
            [label for label, _ in problems])


# --------------------------------------------------------------------------- P1: load_for_lora


@dataclass
class LoadCase:
    label: str
    seed: int
    r: int
    lora_alpha: int
    target_modules: Any
    quantize: bool


def _expected_targets(targets: Any, layers: int) -> set[str]:
    names = ALL_LINEAR if targets == "all-linear" else tuple(targets)
    return {f"model.layers.{i}.{'self_attn' if n in ALL_LINEAR[:4] else 'mlp'}.{n}" for i in range(layers) for n in names}


def _lora_modules(model) -> dict[str, Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {n: m for n, m in base.named_modules() if hasattr(m, "lora_A") and "default" in getattr(m, "lora_A", {})}


def describe_lora_model(model: Any) -> dict:
    """What :func:`load_problems` reads of a model ``load_for_lora`` returned, as data: its kind, each adapted
    module's rank, scale, dropout and whether its lora_B is nonzero, the first base layer's type and 4-bit
    settings, gradient checkpointing, the trainable tensors' names and the final norm's dtype."""
    import bitsandbytes as bnb
    from peft import PeftModel

    if model is None:
        return {"kind": "none"}
    if not isinstance(model, PeftModel):
        return {"kind": "other", "type": type(model).__name__}
    base = model.get_base_model()
    mods = {n: {"rank": int(m.lora_A["default"].weight.shape[0]), "scaling": float(m.scaling["default"]),
                "b_nonzero": bool(m.lora_B["default"].weight.ne(0).any()),
                "dropout": float(getattr(m.lora_dropout["default"], "p", 0.0))}
            for n, m in sorted(_lora_modules(model).items())}
    layer = None
    first = next(iter(sorted(_lora_modules(model).items())), (None, None))[1]
    if first is not None:
        bl = first.base_layer
        layer = {"type": type(bl).__name__, "four_bit": isinstance(bl, bnb.nn.Linear4bit), "dtype": str(bl.weight.dtype)}
        if layer["four_bit"]:
            layer.update(quant_type=str(bl.weight.quant_type), nested=bool(getattr(bl.weight.quant_state, "nested", False)),
                         compute_dtype=str(bl.compute_dtype))
    with quiet([]):
        checkpointing = bool(getattr(base, "is_gradient_checkpointing", False))
    return {"kind": "peft", "modules": mods, "layer": layer, "checkpointing": checkpointing,
            "trainable": [n for n, p in model.named_parameters() if p.requires_grad],
            "norm_dtype": str(base.model.norm.weight.dtype)}


def load_problems(desc: dict, case: LoadCase, layers: int = 2, hidden: bool = False) -> list[tuple[str, str]]:
    """What is wrong with a model ``load_for_lora`` returned for ``case``, from its description
    (:func:`describe_lora_model`), as ``(label, sentence)`` pairs: the mistake's short name (the class report
    counts it) and the feedback; empty: nothing. ``hidden``: say it without the case's numbers or module names
    (a hidden case's inputs are not shown)."""
    if desc["kind"] == "none":
        return [("returned None", "returned None: return the model that get_peft_model gives you.")]
    if desc["kind"] != "peft":
        return [("not a PeftModel", f"returned {desc['type']}, not a PeftModel: finish with get_peft_model(model, "
                 f"LoraConfig(...)) and return what it gives you. " + READ_RECIPE)]
    out: list[tuple[str, str]] = []
    mods = desc["modules"]
    want = _expected_targets(case.target_modules, layers)
    got = set(mods)
    if got != want:
        missing, extra = sorted(want - got), sorted(got - want)
        where = "" if hidden else (" (" + (f"missing {missing[0]}" if missing else "") + (" and " if missing and extra else "")
                                   + (f"unexpected {extra[0]}" if extra else "") + f"; {len(got)} adapted, {len(want)} asked for)")
        out.append(("wrong modules", f"the adapters sit on the wrong modules{where}. Pass target_modules through to "
                    f"LoraConfig unchanged."))
    bad_rank = [(n, m) for n, m in sorted(mods.items()) if m["rank"] != case.r]
    bad_scale = [(n, m) for n, m in sorted(mods.items()) if abs(m["scaling"] - case.lora_alpha / case.r) > 1e-9]
    if bad_rank:
        name, m = bad_rank[0]
        r, scaling = m["rank"], m["scaling"]
        swapped = r == case.lora_alpha and abs(scaling - case.r / case.lora_alpha) < 1e-9
        out.append(("r and lora_alpha swapped" if swapped else "rank", "the adapters' rank is not the r passed in" + (" (lora_alpha and r swapped?)." if swapped else ".")
                   if hidden else f"{name} has an adapter of rank {r}; the task asks for r = {case.r}"
                   + (" (lora_alpha and r swapped?)." if swapped else ".")))
    elif bad_scale:
        name, m = bad_scale[0]
        out.append(("scale", "the adapters' scale s is not lora_alpha / r: pass r and lora_alpha to LoraConfig as given."
                   if hidden else f"the adapter's scale s on {name} is {m['scaling']:g}; LoraConfig(r={case.r}, "
                   f"lora_alpha={case.lora_alpha}) gives s = lora_alpha / r = {case.lora_alpha / case.r:g}."))
    if any(m["b_nonzero"] for m in mods.values()):
        out.append(("B not zero", "lora_B is not zero at the start: LoRA starts from B = 0, so that the adapted model equals the base "
                   "before training and only lora_B gets a gradient at first (the preflight relies on it). Keep "
                   "LoraConfig's default init_lora_weights."))
    if {m["dropout"] for m in mods.values()} - {0.0}:
        out.append(("dropout", "the adapters have dropout: the recipe uses lora_dropout=0.0 (with dropout on, the loss of one batch "
                   "changes from call to call, and the preflight and the checks below compare exact numbers)."))
    if desc["checkpointing"]:
        out.append(("checkpointing", "gradient checkpointing is on: it costs one extra forward of every decoder layer per step, and on a CPU "
                   "the time per step, not the memory, is what limits this run; "
                   "use prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)."))
    layer = desc["layer"]
    if layer is not None:
        if case.quantize:
            if not layer["four_bit"]:
                out.append(("not 4-bit", f"the base layers are {layer['type']}, not 4-bit: pass BitsAndBytesConfig(load_in_4bit=True, "
                           f"...) as quantization_config to from_pretrained. " + READ_RECIPE))
            else:
                if layer["quant_type"] != "nf4":
                    out.append(("not nf4", f"the base is quantized as {layer['quant_type']}, not nf4: bnb_4bit_quant_type='nf4'."))
                if not layer["nested"]:
                    out.append(("no double quantization", "the per-block absmax constants are not quantized again: QLoRA's double quantization is "
                               "bnb_4bit_use_double_quant=True (lesson 15)."))
                if layer["compute_dtype"] != "torch.bfloat16":
                    out.append(("compute dtype", f"the 4-bit layers compute in {layer['compute_dtype'].replace('torch.', '')}; the recipe "
                               f"computes in bfloat16 (bnb_4bit_compute_dtype=torch.bfloat16; the default is float32)."))
        else:
            if layer["four_bit"]:
                out.append(("quantized anyway", "with quantize=False the base must stay 16-bit: load it without a quantization_config."))
            elif layer["dtype"] == "torch.float32":
                out.append(("float32 base", "with quantize=False every base weight is float32, twice the memory of the bf16 base: load "
                           "with dtype=torch.bfloat16, and do not run prepare_model_for_kbit_training on an unquantized "
                           "model (it casts every bf16 weight to float32). One of the two happened here."))
            elif layer["dtype"] != "torch.bfloat16":
                out.append(("not bf16", f"with quantize=False the base weights are {layer['dtype'].replace('torch.', '')}; "
                           f"load the bf16 base (dtype=torch.bfloat16)."))
    trainable = list(desc["trainable"])
    not_adapter = [n for n in trainable if "lora_" not in n]
    if not_adapter:
        eg = "" if hidden else f" ({len(not_adapter)}, e.g. {not_adapter[0]})"
        out.append(("base trainable", f"tensors outside the adapter are trainable{eg}: only lora_A and lora_B should train. "
                   f"get_peft_model freezes the base; something unfroze it afterwards."))
    if not trainable:
        out.append(("nothing trainable", "nothing is trainable: the adapter's tensors have requires_grad=False."))
    norm = desc["norm_dtype"]
    if case.quantize and norm != "torch.float32":
        out.append(("not prepared for k-bit", f"the layer norms are {norm.replace('torch.', '')}: prepare_model_for_kbit_training (which "
                   f"casts them, and the embedding, to float32: every parameter left in 16 bits) was not run before get_peft_model. "
                   + READ_RECIPE))
    weights_bf16 = layer is not None and layer["dtype"] == "torch.bfloat16"
    if not case.quantize and norm == "torch.float32" and weights_bf16:
        out.append(("norms cast", "with quantize=False the norms are float32 though the weights are bf16: something cast them (the "
                   "recipe runs prepare_model_for_kbit_training only for a quantized base)."))
    return out


def _measure_load(fn: Callable, seed: int, r: int, lora_alpha: int, target_modules: Any, quantize: bool) -> dict:
    """Call ``load_for_lora`` on the tiny checkpoint of ``seed`` and describe what it returned."""
    model, used = _watched(fn, (str(tiny_path(seed)), r, lora_alpha, target_modules, quantize),
                           (ctrain.load_for_lora, ctrain.attach_adapter, cmodel.load_model))
    return {"borrowed": used, **describe_lora_model(model)}


class LoadItem(_ModelItem):
    """Implement ``load_for_lora(path, r, lora_alpha, target_modules, quantize)``: checked on tiny checkpoints."""

    withheld = ("coursekit.train:load_for_lora", "coursekit.train:attach_adapter", "coursekit.model:load_model",
                "coursekit.recipe:load_for_lora")

    def public(self):
        return [LoadCase("NF4, r = 4, lora_alpha = 8, all-linear", 0, 4, 8, "all-linear", True),
                LoadCase("bf16, r = 2, lora_alpha = 8, q_proj and v_proj", 0, 2, 8, ["q_proj", "v_proj"], False)]

    def hidden(self, rng):
        out = []
        for q in (True, False):
            r = int(rng.integers(1, 9))
            alpha = int(rng.choice([a for a in (r, 2 * r, 16, 3) if a != r] or [2 * r]))
            k = int(rng.integers(1, 8))
            targets = "all-linear" if rng.random() < 0.4 else sorted(rng.choice(ALL_LINEAR, size=k, replace=False).tolist())
            out.append(LoadCase("", int(rng.integers(1, 1000)), r, alpha, targets, q))
        return out

    def run_case(self, fn, case: LoadCase, tag, hidden):
        targets = list(case.target_modules) if isinstance(case.target_modules, list) else case.target_modules
        ok, got = _call(fn, _measure_load, (case.seed, case.r, case.lora_alpha, targets, case.quantize), self.name, tag,
                        hidden)
        if not ok:
            return False, got
        problems = load_problems(got, case, hidden=hidden)
        if problems:
            return _named(tag, problems, shown=3)
        return True, [f"✓ {tag}: {'NF4 with double quantization, norms in float32' if case.quantize else 'bf16 base'}, "
                      f"adapters where asked, only lora_A and lora_B trainable."]


# --------------------------------------------------------------------------- P2: preflight


@dataclass
class PreflightCase:
    label: str
    seed: int
    fault: str  # "" (healthy), "frozen", "cut", "nan", "base_moves"


def _qlora_tiny(seed: int, r: int = 4):
    torch.manual_seed(seed)
    return _quiet_call(ctrain.load_for_lora, tiny_path(seed % 3), r, 2 * r, "all-linear", True)


def _detach_input(module, args, kwargs):
    """A forward pre-hook that cuts the gradient path at a decoder layer's input (the "cut" case)."""
    if args:
        return (args[0].detach(),) + tuple(args[1:]), kwargs
    return args, {**kwargs, "hidden_states": kwargs["hidden_states"].detach()}


def preflight_setup(case: PreflightCase):
    """(model, batch, optimizer) for one preflight case: a healthy tiny QLoRA model, or one broken by ``case.fault``."""
    model = _qlora_tiny(case.seed)
    batch = tiny_batch(case.seed)
    extra = []
    if case.fault == "base_moves":  # a base weight left trainable and handed to the optimizer
        norm = model.get_base_model().model.norm.weight
        norm.requires_grad_(True)
        extra = [norm]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad and all(p is not e for e in extra)] + extra,
                            lr=1e-2)
    if case.fault == "frozen":
        for p in model.parameters():
            p.requires_grad_(False)
    elif case.fault == "cut":  # the top block's input is detached: no gradient reaches the adapters below it
        model.get_base_model().model.layers[-1].register_forward_pre_hook(_detach_input, with_kwargs=True)
    elif case.fault == "nan":
        with torch.no_grad():
            model.get_base_model().model.norm.weight[0] = float("nan")
    return model, batch, opt


_FAULTS = {
    "": "a healthy model",
    "frozen": "a model whose adapter was frozen after the optimizer was built",
    "cut": "a model whose top block receives a detached input",
    "nan": "a model whose final norm holds a NaN",
    "base_moves": "a model whose final norm was left trainable and is in the optimizer",
}
_MISSED = {
    "frozen": "nothing on this model trains (every tensor has requires_grad=False), and your preflight let it through. "
              "Check first that some parameter requires a gradient.",
    "cut": "every lora_B below the top block got no gradient (None or all zero), and your preflight let it through. "
           "Check each lora_B's .grad after one backward: with B = 0 at the start, ∇B = s·Zᵀ·D is nonzero whenever a "
           "gradient reaches the layer.",
    "nan": "the loss on this batch is NaN, and your preflight let it through. Check torch.isfinite on the loss and on "
           "every gradient.",
    "base_moves": "one optimizer step changed a base weight (the final norm), and your preflight let it through. Copy "
                  "every non-adapter parameter before optimizer.step() and compare after (torch.equal).",
}


class PreflightItem(_ModelItem):
    """Implement ``preflight(model, batch, optimizer)``: raises on four broken tiny models, passes a healthy one and
    leaves it (parameters, gradients and optimizer state) as it found it. A refusal of a broken model counts only
    when the same preflight passed the healthy model of its case set: a function that raises on everything
    (or cannot even be called) refuses nothing in particular."""

    withheld = ("coursekit.train:preflight", "coursekit.capstone:_reference_preflight")

    def public(self):
        return [PreflightCase(_FAULTS[f], 0, f) for f in _FAULTS]

    def hidden(self, rng):
        seed = int(rng.integers(1, 1000))  # one healthy model and its four broken versions
        return [PreflightCase("", seed, f) for f in _FAULTS]

    def check(self, answer: Any, ctx: Any) -> Feedback:
        import inspect

        if callable(answer):
            try:
                inspect.signature(answer).bind(None, None, None)
            except TypeError:
                return Feedback(0, self.points, ["preflight must take three arguments: preflight(model, batch, optimizer)."])
            except ValueError:  # no signature to read (a builtin): let the cases find out
                pass
        self._healthy: dict[int, bool | str] = {}  # seed → True (passed), "refused" or absent (failed another way)
        return super().check(answer, ctx)

    def run_case(self, fn, case: PreflightCase, tag, hidden):
        ok, got = _call(fn, _measure_preflight, (case.seed, case.fault), self.name, tag, hidden)
        if not ok:
            return False, got
        raised = got["raised"]
        said = "" if hidden or raised is None else f" (it said: {str(raised[0])[:60]}: {str(raised[1])[:160]})"
        if case.fault:
            if raised is None:
                return _named(tag, [(f"misses {case.fault.replace('_', ' ')}", f"{_MISSED[case.fault]} " + READ_PREFLIGHT)])
            healthy = self._healthy.get(case.seed)
            if healthy == "refused":
                return False, [f"✗ {tag}: refused{said}, but your preflight also refuses the healthy model, so this "
                               f"refusal says nothing about the fault."]
            if healthy is not True:
                return False, [f"✗ {tag}: refused{said}, but your preflight did not pass the healthy model's case (see "
                               f"above), so this refusal counts only once that one passes."]
            return True, [f"✓ {tag}: refused{said}."]
        if raised is not None:
            self._healthy[case.seed] = "refused"
            msg = f"✗ {tag}: your preflight refused a healthy model{said}."
            if "lora_a" in str(raised[1]).lower():
                msg += (" At the start B = 0, so every lora_A gradient is exactly zero (∇A = s·Xᵀ·D·Bᵀ): a zero lora_A "
                        "gradient is expected. Check lora_B.")
            return False, [msg + " " + READ_PREFLIGHT], ["refuses a healthy model"]
        moved, left = list(got["moved"]), list(got["left"])
        if moved:
            return False, [f"✗ {tag}: after your preflight {len(moved)} tensors differ from before (e.g. {moved[0]}): the "
                           f"run would start from a model the preflight already stepped. Save the parameters (a copy of "
                           f"each, or copy.deepcopy(model.state_dict())) and copy them back before returning. " + READ_PREFLIGHT], \
                ["parameters not restored"]
        if got["optimizer_state"]:
            return False, [f"✗ {tag}: after your preflight the optimizer holds state for {int(got['optimizer_state'])} "
                           f"tensors (AdamW's moments from the preflight step): the first real step would use them. Save "
                           f"copy.deepcopy(optimizer.state_dict()) first and load it back at the end."], \
                ["optimizer state not restored"]
        if left:
            return False, [f"✗ {tag}: after your preflight {len(left)} tensors still hold a gradient (e.g. {left[0]}): the "
                           f"first training step would add its own gradient to it. End with "
                           f"optimizer.zero_grad(set_to_none=True)."], ["gradients left"]
        self._healthy[case.seed] = True
        return True, [f"✓ {tag}: passed, and the model and the optimizer are as they were."]


def _measure_preflight(fn: Callable, seed: int, fault: str) -> dict:
    """Build the preflight case (``seed``, ``fault``), run ``preflight(model, batch, optimizer)`` on it, and say what
    happened: whether it raised (type and message), and which parameters moved, which still hold a gradient and how
    many tensors the optimizer holds state for."""
    model, batch, opt = preflight_setup(PreflightCase("", seed, fault))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    raised, used = None, []
    watch = _CallWatch()
    try:
        with watch():
            fn(model, batch, opt)
    except NotImplementedError:
        raise
    except (Exception, SystemExit) as e:
        try:
            raised = [type(e).__name__, str(e)[:300]]
        except Exception:
            raised = [type(e).__name__, "(its message could not be read)"]
    used = _borrowed(watch, (ctrain.preflight, capstone._reference_preflight), allowed=(_detach_input,))
    return {"borrowed": used, "raised": raised,
            "moved": [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])],
            "optimizer_state": len(opt.state),
            "left": [n for n, p in model.named_parameters() if p.grad is not None and bool(p.grad.ne(0).any())]}


# --------------------------------------------------------------------------- P3: adapter_optimizer


@dataclass
class OptCase:
    label: str
    seed: int
    lr: float
    weight_decay: float


class OptimizerItem(_ModelItem):
    """Implement ``adapter_optimizer(model, lr, weight_decay)``: AdamW over the trainable tensors only."""

    withheld = ("coursekit.train:adapter_optimizer", "coursekit.recipe:adapter_optimizer")

    def public(self):
        return [OptCase("lr 1e-3, no weight decay", 0, 1e-3, 0.0), OptCase("lr 5e-4, weight decay 0.01", 1, 5e-4, 0.01)]

    def hidden(self, rng):
        return [OptCase("", int(rng.integers(1, 1000)), float(rng.choice([1e-4, 2e-4, 3e-3])),
                        float(rng.choice([0.0, 0.05, 0.1])))]

    def run_case(self, fn, case: OptCase, tag, hidden):
        ok, got = _call(fn, _measure_optimizer, (case.seed, case.lr, case.weight_decay), self.name, tag, hidden)
        if not ok:
            return False, got
        if not got["optimizer"]:
            return _named(tag, [("not an optimizer", f"returned {got['type']}; return the torch.optim.AdamW you built.")])
        changed, frozen = list(got["changed"]), list(got["frozen"])
        if changed:
            return _named(tag, [("changes what trains", f"your function changed which tensors train ({len(changed)}, e.g. "
                                f"{changed[0]}): it should only build the optimizer over the tensors that are already trainable.")])
        lines = []
        if got["type"] != "AdamW":
            extra = (" Adam adds the decay to the gradient (L2), where it is rescaled by the adaptive step; AdamW decays "
                     "the weights directly (decoupled)." if got["type"] == "Adam" else "")
            lines.append(("not AdamW", f"the optimizer is {got['type']}; the recipe uses torch.optim.AdamW.{extra}"))
        if frozen:
            lines.append(("frozen tensors in the optimizer", f"the optimizer holds frozen base tensors ({len(frozen)}, e.g. {frozen[0]}). They stay put today "
                         f"only because their .grad is None; anything that gives one a gradient (an unfrozen norm, a hook) "
                         f"lets AdamW move or decay the base. Build it from [p for p in model.parameters() if p.requires_grad]."))
        if got["missing"]:
            lines.append(("adapter tensors missing", f"{int(got['missing'])} adapter tensors are not in the optimizer: they "
                          f"would get gradients and never move."))
        lrs, wds = list(got["lrs"]), list(got["weight_decays"])
        if set(lrs) != {case.lr}:
            lines.append(("lr", "the learning rate is not the lr passed in." if hidden else
                          f"the learning rate is {sorted(lrs, key=str)[0]}; the task passes lr = {case.lr:g}."))
        if set(wds) != {case.weight_decay}:
            lines.append(("weight decay", "the weight decay is not the weight_decay passed in." if hidden else
                          f"the weight decay is {' and '.join(map(str, sorted(set(wds), key=str)))}; the task passes "
                          f"weight_decay = {case.weight_decay:g} for every tensor."))
        if lines:
            return _named(tag, lines)
        return True, [f"✓ {tag}: AdamW over the {int(got['trainable'])} adapter tensors, lr and weight decay as asked."]


def _number(x: Any) -> Any:
    try:
        return float(x)
    except Exception:
        return str(x)[:60]


def _measure_optimizer(fn: Callable, seed: int, lr: float, weight_decay: float) -> dict:
    """Run ``adapter_optimizer(model, lr, weight_decay)`` on a tiny QLoRA model and describe the optimizer: its type,
    which tensors it holds (frozen ones, missing adapter ones), their learning rates and weight decays, and whether
    the function changed which tensors train."""
    model = _qlora_tiny(seed)
    trainable = [p for p in model.parameters() if p.requires_grad]  # decided before the student's code runs
    meant = {id(p) for p in trainable}
    opt, used = _watched(fn, (model, lr, weight_decay), (ctrain.adapter_optimizer,))
    if not isinstance(opt, torch.optim.Optimizer):
        return {"borrowed": used, "optimizer": False, "type": type(opt).__name__}
    owned = {id(p) for g in opt.param_groups for p in g["params"]}
    kind = ("AdamW" if type(opt) is torch.optim.AdamW else "Adam" if type(opt) is torch.optim.Adam else
            type(opt).__name__ + ("" if type(opt).__module__.startswith("torch.optim") else " (a class of your own)"))
    return {"borrowed": used, "optimizer": True, "type": kind, "trainable": len(trainable),
            "changed": [n for n, p in model.named_parameters() if p.requires_grad != (id(p) in meant)],
            "frozen": [n for n, p in model.named_parameters() if id(p) not in meant and id(p) in owned],
            "missing": sum(id(p) not in owned for p in trainable),
            "lrs": [_number(g.get("lr")) for g in opt.param_groups],
            "weight_decays": [_number(g.get("weight_decay")) for g in opt.param_groups]}


# --------------------------------------------------------------------------- P4: train_steps


@dataclass
class TrainCase:
    label: str
    seed: int
    steps: int
    lr: float
    rows: tuple  # supervised tokens per row, per micro-batch: ((1, 1), (4, 3)) = two micro-batches


def _train_model(seed: int):
    torch.manual_seed(seed)
    base = _quiet_call(cmodel.load_model, "fp32", tiny_path(seed % 3))
    model = _quiet_call(ctrain.attach_adapter, base, ctrain.TrainConfig(r=4, lora_alpha=8), False)
    with torch.no_grad():  # a nonzero B, so every factor moves from the first step on
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return model


def _windows(case: TrainCase) -> list[list[dict]]:
    """``case.steps`` windows; window s uses ``case.rows`` with every count moved on by s (1 to 5 tokens), so that
    the windows' token counts N differ and a loop that divides by anything but N is seen."""
    out = []
    for step in range(case.steps):
        window = []
        for j, sup in enumerate(case.rows):
            b = tiny_batch(case.seed * 1000 + step * 10 + j, rows=len(sup), length=10, answer=1)
            for i, k in enumerate(sup):
                k = (k - 1 + step) % 5 + 1
                b["labels"][i] = IGNORE_INDEX
                b["labels"][i, -k:] = b["input_ids"][i, -k:]
            window.append(b)
        out.append(window)
    return out


def _optimizer_and_schedule(model, lr: float, steps: int):
    """What the check hands the student's loop: plain SGD (its step is linear in the gradient, so every error in the
    loss's scale shows; AdamW's first steps are about lr·sign(g) and would hide it) and a linear decay to 0."""
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    return opt, get_linear_schedule_with_warmup(opt, 0, steps)


def _variant_losses(model, windows, lr, variant: str) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Train a copy of ``model`` with a known loop (``variant`` "" is the right one) and return its adapter and losses."""
    m = copy.deepcopy(model)
    opt, sched = _optimizer_and_schedule(m, lr, len(windows))
    losses = []
    m.train()
    for window in windows:
        n = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in window)
        total = 0.0
        for b in window:
            s, k = ctrain.supervised_loss_sum(m, b)
            if variant == "mean_of_means":
                loss = (s / k) / len(window)
            elif variant == "sum_of_means":
                loss = s / k
            elif variant == "sum":
                loss = s
            else:
                loss = s / n
            loss.backward()
            total += s.item()
            if variant == "step_per_micro":
                opt.step()
                opt.zero_grad(set_to_none=True)
        if variant != "step_per_micro":
            opt.step()
        if variant != "no_schedule":
            sched.step()
        if variant != "no_zero_grad":
            opt.zero_grad(set_to_none=True)
        losses.append(total / n)
    return {n: p.detach().clone() for n, p in m.named_parameters() if p.requires_grad}, losses


_LOOP_MISTAKES = {
    "mean_of_means": "you averaged each micro-batch's own mean loss: a micro-batch with few supervised tokens then weighs as "
                     "much as one with many. Divide each micro-batch's loss sum by the window's token count N.",
    "sum_of_means": "you added the micro-batches' mean losses (model(**batch).loss per micro-batch, backward on each): "
                    "the gradient grows with the number of micro-batches, and short answers weigh more. Divide each "
                    "micro-batch's loss sum by the window's token count N.",
    "sum": "you back-propagated the summed token losses without dividing by N: the step size now grows with the number "
           "of supervised tokens.",
    "step_per_micro": "you called optimizer.step() after every micro-batch: that is a smaller batch, not gradient "
                      "accumulation. Step once per window.",
    "no_zero_grad": "the gradients were never cleared between windows: each step adds the old gradients again. Call "
                    "optimizer.zero_grad(set_to_none=True) after each step.",
    "no_schedule": "the learning rate never changed: call scheduler.step() once per window, after optimizer.step().",
}


class TrainItem(_ModelItem):
    """Implement ``train_steps(model, windows, optimizer, scheduler, progress)``: graded by the adapter after the
    steps (against the reference loop on a copy of the same model, with the same optimizer and schedule) and by
    the losses returned."""

    def public(self):
        return [TrainCase("3 windows of two micro-batches: 1+1 and 4+3 supervised tokens", 0, 3, 0.5, ((1, 1), (4, 3))),
                TrainCase("2 windows of three micro-batches", 1, 2, 0.3, ((2,), (1, 5), (3, 3)))]

    def hidden(self, rng):
        rows = tuple(tuple(int(x) for x in rng.integers(1, 6, size=int(rng.integers(1, 3)))) for _ in range(int(rng.integers(2, 4))))
        return [TrainCase("", int(rng.integers(1, 1000)), int(rng.integers(2, 4)), float(rng.choice([0.2, 0.4])), rows)]

    def run_case(self, fn, case: TrainCase, tag, hidden):
        model = _train_model(case.seed)
        windows = _windows(case)
        want, want_losses = _variant_losses(model, windows, case.lr, "")
        ok, got = _call(fn, _measure_train, (case.seed, case.steps, case.lr, case.rows), self.name, tag, hidden)
        if not ok:
            return False, got
        start = {n: p.detach() for n, p in model.named_parameters() if n in want}  # _variant_losses trained copies
        params, moved = got["params"], list(got["moved"])
        if set(params) != set(want) or any(tuple(params[n].shape) != tuple(want[n].shape) for n in want):
            raise _Unreadable("adapter")
        cast = [n for n in want if params[n].dtype != want[n].dtype]
        if cast:
            return False, [f"✗ {tag}: your {self.name} changed the adapter's dtype ({cast[0]} is now "
                           f"{str(params[cast[0]].dtype).replace('torch.', '')}, was {str(want[cast[0]].dtype).replace('torch.', '')}): "
                           f"the optimizer steps the tensors in place; do not replace or cast them."]
        if moved:
            return _named(tag, [("base moved", f"a frozen base tensor changed ({moved[0]}): only the adapter may move.")])
        if all(torch.equal(params[n], start[n]) for n in params):
            return _named(tag, [("no step", f"the adapter did not move at all: each window needs loss.backward() on its "
                                f"micro-batches, then optimizer.step(). " + READ_LOOP)])
        close = all(torch.allclose(params[n], want[n], rtol=1e-4, atol=1e-7) for n in want)
        if not close:
            for variant, why in _LOOP_MISTAKES.items():
                alt, _ = _variant_losses(model, windows, case.lr, variant)
                if all(torch.allclose(params[n], alt[n], rtol=1e-4, atol=1e-7) for n in alt):
                    return _named(tag, [(variant.replace("_", " "), f"the adapter after the steps is not the reference's. "
                                         f"Likely mistake: {why} " + READ_LOOP)])
            n0 = next(n for n in want if not torch.allclose(params[n], want[n], rtol=1e-4, atol=1e-7))
            diff = (params[n0] - want[n0]).abs().max().item()
            where = "" if hidden else f" (e.g. {n0.replace('base_model.model.', '')}, largest difference {diff:.2e})"
            return False, [f"✗ {tag}: the adapter after the steps differs from the reference loop's{where}: one step per "
                           f"window, each micro-batch's loss sum divided by the window's supervised tokens N, backward, "
                           f"then optimizer.step(), scheduler.step(), optimizer.zero_grad(). " + READ_LOOP]
        result = got["result"]
        seq = result.get("loss") if isinstance(result, dict) else result
        try:
            losses = [float(x) for x in seq]
        except (TypeError, ValueError):
            kind = getattr(result, "type_name", type(result).__name__)
            return _named(tag, [("losses not returned", f"the adapter is right, but {self.name} returned {kind}: return "
                                f"the list of window losses, one float per step.")])
        if len(losses) != len(windows):
            return False, [f"✗ {tag}: the adapter is right, but {self.name} returned {len(losses)} losses for "
                           f"{len(windows)} windows: return one loss per step."]
        if not np.allclose(losses, want_losses, rtol=1e-4, atol=1e-6):
            return _named(tag, [("losses not token-weighted", f"the adapter is right, but the losses returned are not each "
                                f"window's token-weighted mean (Σ loss sums / N, before the step): plot them and they mislead.")])
        return True, [f"✓ {tag}: the adapter after {len(windows)} steps matches the reference loop, and so do the losses."]


def _measure_train(fn: Callable, seed: int, steps: int, lr: float, rows: tuple) -> dict:
    """Run ``train_steps`` on the tiny model and windows of a train case, with the check's optimizer and schedule, and
    send back the adapter after the steps, the frozen tensors that moved, and what the function returned."""
    model = _train_model(seed)
    windows = _windows(TrainCase("", seed, steps, lr, rows))
    opt, sched = _optimizer_and_schedule(model, lr, len(windows))
    adapter = [n for n, p in model.named_parameters() if p.requires_grad]
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    result, used = _watched(fn, (model, windows, opt, sched, False), (ctrain.train_steps, ctrain.train))
    now = dict(model.named_parameters())
    return {"borrowed": used, "result": result, "params": {n: now[n].detach().clone() for n in adapter if n in now},
            "moved": [n for n, p in now.items() if n not in adapter and n in start and not torch.equal(p.detach(), start[n])]}


# --------------------------------------------------------------------------- P5: answer_logprobs (a Function item)


def _logprob_case(seed: int, R: int, T: int, V: int, spans: list[tuple[int, int]]) -> dict:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(R, T, V, generator=g) * 2
    labels = torch.full((R, T), IGNORE_INDEX, dtype=torch.long)
    for r, (a, b) in enumerate(spans):
        labels[r, a:b] = torch.randint(0, V, (b - a,), generator=g)
    return {"logits": logits, "labels": labels}


def _p5_public() -> list[Case]:
    return [Case(_logprob_case(0, 2, 5, 7, [(3, 5), (4, 5)]), "2 rows, 5 positions, a vocabulary of 7; answers at the end"),
            Case(_logprob_case(1, 3, 6, 11, [(2, 6), (5, 6), (1, 3)]), "3 rows; one answer in the middle, followed by -100")]


def _p5_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for _ in range(3):
        R, T, V = int(rng.integers(1, 5)), int(rng.integers(3, 9)), int(rng.integers(3, 30))
        spans = []
        for _ in range(R):
            a = int(rng.integers(1, T))
            spans.append((a, int(rng.integers(a + 1, T + 1))))
        out.append(Case(_logprob_case(int(rng.integers(0, 10_000)), R, T, V, spans)))
    return out


def _p5_mistakes(kw: dict, got: dict) -> dict:
    logits, labels = kw["logits"].double(), kw["labels"]
    logp = torch.log_softmax(logits, -1)
    keep = labels != IGNORE_INDEX
    tok = labels.clamp(min=0)
    unshifted = (logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1) * keep).sum(-1)
    right = ceval.answer_logprobs(logits, labels).double()
    n = keep[:, 1:].sum(-1).clamp(min=1)
    prob_sum = (torch.softmax(logits[:, :-1], -1).gather(-1, tok[:, 1:].unsqueeze(-1)).squeeze(-1) * keep[:, 1:]).sum(-1)
    logit_sum = (logits[:, :-1].gather(-1, tok[:, 1:].unsqueeze(-1)).squeeze(-1) * keep[:, 1:]).sum(-1)
    return {"result": worded([
        Mistake("no shift", unshifted.numpy(), "you scored labels[t] with the logits at the same position t; the logit at "
                "position t predicts the token at t + 1, so pair logits[:, :-1] with labels[:, 1:]. " + READ_SCORING),
        Mistake("mean", (right / n).numpy(), "you averaged the log-probabilities over the answer's tokens; label scoring "
                "sums them (the log-likelihood of the whole answer). " + READ_SCORING),
        Mistake("loss", (-right).numpy(), "these are the negated values, the loss: return log-likelihoods (≤ 0), "
                "which the best label maximizes."),
        Mistake("probabilities", prob_sum.numpy(), "you summed probabilities, not log-probabilities: the likelihood of "
                "a sequence is a product of probabilities, a sum of their logs (log_softmax, not softmax)."),
        Mistake("raw logits", logit_sum.numpy(), "you summed raw logits: normalise them first with log_softmax over the "
                "vocabulary, or a label with large logits everywhere wins."),
    ])}


# --------------------------------------------------------------------------- P6: first_word


FIRST_WORD_CASES = [("Thermal.", "thermal"), ("  **software** issue", "software"), ("", ""),
                    ("The fan is hot", "the"), ("network\nelectrical", "network"), ("(hydraulic)", "hydraulic")]


class FirstWordItem:
    """Implement ``first_word(text)``: every case's answer must equal coursekit's rule (strings, so a custom check)."""

    withheld = ("coursekit.evaluate:first_word", "coursekit.recipe:first_word")  # stubbed in the grader's runner

    def __init__(self, title: str, points: float):
        self.title, self.points, self.name = title, points, "first_word"

    def check(self, answer: Any, ctx: Any) -> Feedback:
        if not callable(answer):
            return Feedback(0, self.points, ["first_word should be a function; define it with def first_word(text):"])
        cases = list(FIRST_WORD_CASES)
        if ctx.hidden:
            rng = ctx.rng()
            lead, quote, stop, tail = ["", " ", "\n"], ["", "*", '"', "`"], [".", ",", ":", "!", ""], ["now", "issue", ""]
            for _ in range(8):
                w = str(rng.choice(LABELS))
                w = w.capitalize() if rng.random() < 0.5 else w
                q = str(rng.choice(quote))
                cases.append((str(rng.choice(lead)) + q + w + q + str(rng.choice(stop)) + " " + str(rng.choice(tail)), None))
        lines, passed, named = [], 0, []
        for i, (text, _) in enumerate(cases, 1):
            hidden = i > len(FIRST_WORD_CASES)
            want = ceval.first_word(text)
            tag = f"hidden case {i}" if hidden else f"public case {i} ({text!r})"
            try:
                ok, got = _call(answer, _measure_first_word, (text,), self.name, tag, hidden)
            except _Stub:
                return Feedback(0, self.points, ["first_word still raises NotImplementedError: replace the stub with your code."])
            except _Unreadable:
                ok, got = False, [f"✗ {tag}: what came back from your first_word could not be read; nothing in it counts."]
            if not ok:
                lines += got
                continue
            got = got.get("result")
            if got == want:
                passed += 1
                lines.append(f"✓ {tag}" + ("" if hidden else f": {got!r}"))
                continue
            why = ""
            strip = " Strip the punctuation around the word (. , : ; ! ? quotes * parentheses)"
            if isinstance(got, str) and got.lower() == want:
                why, labels = " Lower-case it: labels are lowercase.", ["not lower-cased"]
            elif isinstance(got, str) and got.strip(ceval.FIRST_WORD_PUNCTUATION) == want:
                why, labels = strip + ".", ["punctuation kept"]
            elif isinstance(got, str) and got.strip(ceval.FIRST_WORD_PUNCTUATION).lower() == want:  # both slips at once
                why, labels = strip + ", and lower-case it: labels are lowercase.", ["punctuation kept", "not lower-cased"]
            elif isinstance(got, str) and want and want in got.lower() and len(got.split()) > 1:
                if got.split()[0].strip(ceval.FIRST_WORD_PUNCTUATION) == want:
                    why, labels = " Keep only the first word (split on whitespace).", ["more than one word"]
                else:
                    why, labels = (" Keep only the first word (split on whitespace), and lower-case it: labels are "
                                   "lowercase.", ["more than one word", "not lower-cased"])
            if why:
                named.append(labels)
            lines.append(f"✗ {tag}: " + (f"returned {got!r}; the rule gives {want!r}." if not hidden else "not the rule's word.") + why)
        if not ctx.hidden:
            lines.append(PUBLIC_ONLY_NOTE)
        return Feedback(self.points * passed / len(cases), self.points, lines, mistakes=_consistent(named))


def _measure_first_word(fn: Callable, text: str) -> dict:
    result, used = _watched(fn, (text,), (ceval.first_word,))
    return {"borrowed": used, "result": result}


# --------------------------------------------------------------------------- P7: confusion_matrix (a Function item)




def _p7_public() -> list[Case]:
    return [Case({"true": ["x", "x", "y", "z"], "pred": ["x", "y", "y", "the"], "labels": ["x", "y", "z"]},
                 "4 answers over labels x, y, z; one answer is no label"),
            Case({"true": list(LABELS) * 2, "pred": list(LABELS[1:]) + [LABELS[0]] + list(LABELS), "labels": list(LABELS)},
                 "the six course labels, one round shifted by one")]


def _p7_hidden(rng: np.random.Generator) -> list[Case]:
    labels = list(LABELS)
    out = []
    for _ in range(2):
        n = int(rng.integers(8, 30))
        true = [str(x) for x in rng.choice(labels, size=n)]
        pred = [str(x) if rng.random() < 0.8 else str(rng.choice(["the", "urgent", ""])) for x in rng.choice(labels, size=n)]
        pred[int(rng.integers(0, n))] = "maintenance"  # at least one answer that is no label
        out.append(Case({"true": true, "pred": pred, "labels": labels}))
    return out


def _p7_mistakes(kw: dict, got: dict) -> dict:
    ref = ceval.confusion_matrix(**kw)
    return {"result": worded([
        Mistake("no other column", ref[:, :len(kw["labels"])], "a prediction that is no label needs its own last column "
                "(a generated 'the' is an error, and it belongs somewhere)."),
    ])}


# --------------------------------------------------------------------------- P8: merge_onto_w16


@dataclass
class MergeCase:
    label: str
    seed: int
    r: int


def trained_tiny_adapter(case: MergeCase, out_dir: str) -> None:
    """A QLoRA adapter on the tiny checkpoint with nonzero factors (a few reference steps), saved by PEFT."""
    torch.manual_seed(case.seed)
    model = _quiet_call(ctrain.load_for_lora, tiny_path(case.seed % 3), case.r, 2 * case.r, "all-linear", True)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    _quiet_call(model.save_pretrained, out_dir)


def _logits(model, ids) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


class MergeItem(_ModelItem):
    """Implement ``merge_onto_w16(adapter_dir, path)``: the bf16 base at ``path`` with the adapter merged in."""

    withheld = ("coursekit.train:merge_into_bf16", "coursekit.train:merge_into_dequantized", "coursekit.train:load_adapter",
                "coursekit.recipe:merge_onto_w16")

    def public(self):
        return [MergeCase("a tiny NF4-trained adapter, r = 4", 0, 4)]

    def hidden(self, rng):
        return [MergeCase("", int(rng.integers(1, 1000)), int(rng.integers(1, 8)))]

    def run_case(self, fn, case: MergeCase, tag, hidden):
        from peft import PeftModel

        path = tiny_path(case.seed % 3)
        ids = tiny_batch(case.seed)["input_ids"]
        with tempfile.TemporaryDirectory(prefix="coursekit-19-") as adapter_dir:
            trained_tiny_adapter(case, adapter_dir)
            ok, merged = _call(fn, _measure_merge, (adapter_dir, case.seed % 3, ids), self.name, tag, hidden)
            if not ok:
                return False, merged
            want = _logits(_quiet_call(lambda: PeftModel.from_pretrained(
                cmodel.load_model("bf16", path), adapter_dir).merge_and_unload()), ids)
            base = _logits(_quiet_call(cmodel.load_model, "bf16", path), ids)
            nf4 = _quiet_call(lambda: PeftModel.from_pretrained(cmodel.load_model("nf4", path), adapter_dir).merge_and_unload())
            nf4_logits = _logits(nf4, ids)
            onto_w4 = _logits(_quiet_call(lambda: PeftModel.from_pretrained(
                cmodel.dequantized_copy(cmodel.load_model("nf4", path)), adapter_dir).merge_and_unload()), ids)
        if merged["kind"] != "module":
            return _named(tag, [("not a model", f"returned {merged['type']}; return the merged model (merge_and_unload() "
                                f"gives it).")])
        if merged["lora"]:
            return _named(tag, [("not unloaded", f"the returned model still has LoRA layers: merge_and_unload() folds "
                                f"W + sAB into each weight and returns the plain model. " + READ_MERGE)])
        if merged["four_bit"]:
            return _named(tag, [("merged into NF4", f"you merged into the NF4 weights: the merged model is 4-bit, so W + sAB "
                                f"was quantized again, and an update smaller than half a quantization step rounds away. "
                                f"Load the bf16 base from path and merge there. " + READ_MERGE)])
        got = merged["logits"]
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            raise _Unreadable("logits")
        got = got.float()
        if torch.allclose(got, base, rtol=0, atol=1e-6) and not torch.allclose(want, base, rtol=0, atol=1e-6):
            return _named(tag, [("adapter not loaded", f"the merged model computes the bare base model: the trained adapter "
                                f"is not in it (a fresh get_peft_model adapter has B = 0; load the saved one with "
                                f"PeftModel.from_pretrained).")])
        if torch.allclose(got, nf4_logits, rtol=1e-3, atol=1e-3) and not torch.allclose(want, nf4_logits, rtol=1e-3, atol=1e-3):
            return _named(tag, [("merged into NF4", f"the merged model computes what an NF4 merge computes: merge into the "
                                f"bf16 base at path, not into the quantized one. " + READ_MERGE)])
        if torch.allclose(got, onto_w4, rtol=1e-2, atol=1e-2) and not torch.allclose(want, onto_w4, rtol=1e-2, atol=1e-2):
            return _named(tag, [("merged onto dequant(W4)", f"you merged onto dequant(W4), the NF4 weights decoded to "
                                f"bf16. Section 6 below measures that choice, and it has its merits; this function's task "
                                f"is the other route, the bf16 base at path (W16), so that the two can be compared.")])
        dtypes = set(map(str, merged["dtypes"]))
        if dtypes != {"bfloat16"}:
            return _named(tag, [("not bf16", f"your merged model holds {' and '.join(sorted(dtypes))} weights; deploy it "
                                f"as the bf16 base it came from (dtype=torch.bfloat16 when loading): float32 doubles its "
                                f"size, and it is not the model this lesson compares.")])
        if torch.equal(got, want):
            return True, [f"✓ {tag}: the bf16 base with the adapter merged in: logits equal the reference merge."]
        if torch.allclose(got, want, rtol=2e-2, atol=2e-2):
            return True, [f"✓ {tag}: the adapter is merged into the bf16 base; logits agree with the reference merge "
                          f"up to bf16 rounding (the order of the additions differs)."]
        return False, [f"✗ {tag}: the merged model's logits are not the reference merge's (W16 + s·A·B): load the bf16 base "
                       f"from path, PeftModel.from_pretrained(base, adapter_dir), then merge_and_unload(). " + READ_MERGE]


def _measure_merge(fn: Callable, adapter_dir: str, checkpoint: int, ids: torch.Tensor) -> dict:
    """Run ``merge_onto_w16(adapter_dir, path)`` (``path``: the tiny checkpoint ``checkpoint``) and describe the
    model it returned: still LoRA or 4-bit layers, its parameters' dtypes, and its logits on ``ids``."""
    import bitsandbytes as bnb
    from peft import PeftModel

    merged, used = _watched(fn, (adapter_dir, str(tiny_path(checkpoint))),
                            (ctrain.merge_into_bf16, ctrain.merge_into_dequantized, ctrain.load_adapter))
    if merged is None or not isinstance(merged, torch.nn.Module):
        return {"borrowed": used, "kind": "other", "type": type(merged).__name__}
    return {"borrowed": used, "kind": "module",
            "lora": isinstance(merged, PeftModel) or any(hasattr(m, "lora_A") for m in merged.modules()),
            "four_bit": any(isinstance(m, bnb.nn.Linear4bit) for m in merged.modules()),
            "dtypes": sorted({str(p.dtype).replace("torch.", "") for p in merged.parameters()}),
            "logits": _logits(merged, ids)}


# --------------------------------------------------------------------------- P9: the probe's features


READ_PROBE = "Reread 'The cheap alternatives' in The run."


def _probe_case(seed: int, layers: int, rows: list[tuple[int, int]], width: int, layer: int) -> dict:
    """Hidden states as a causal LM returns them (``layers`` + 1 tensors [B, T, H], index 0 the embeddings) and a
    mask with ``rows`` = [(left padding, real tokens)], each row padded on the right to the longest."""
    g = torch.Generator().manual_seed(seed)
    T = max(a + n for a, n in rows)
    hs = tuple(torch.randn(len(rows), T, width, generator=g) + i for i in range(layers + 1))
    mask = torch.tensor([[0] * a + [1] * n + [0] * (T - a - n) for a, n in rows])
    return {"hidden_states": hs, "attention_mask": mask, "layer": layer}


def _p9_public() -> list[Case]:
    return [Case(_probe_case(0, 3, [(0, 4), (0, 2)], 5, 2), "layer 2 of 3; two rows, the second padded on the right"),
            Case(_probe_case(1, 4, [(3, 3), (0, 6), (1, 2)], 4, 4),
                 "the last layer of 4; padding on the left, none, and both sides")]


def _p9_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for _ in range(3):
        layers = int(rng.integers(2, 6))
        rows = [(int(rng.integers(0, 3)), int(rng.integers(1, 6))) for _ in range(int(rng.integers(2, 5)))]
        rows[0] = (0, max(r[0] + r[1] for r in rows) + 1)  # one full row, so every other row has padding
        out.append(Case(_probe_case(int(rng.integers(0, 10_000)), layers, rows, int(rng.integers(3, 9)),
                                    int(rng.integers(1, layers + 1)))))
    return out


def _p9_mistakes(kw: dict, got: dict) -> dict:
    hs, mask, layer = kw["hidden_states"], kw["attention_mask"], kw["layer"]
    h, m = hs[layer].float(), mask.float()
    last = mask.shape[1] - 1 - mask.flip(1).long().argmax(1)
    rows = torch.arange(h.shape[0])
    return {"result": worded([
        Mistake("layer off by one", cheap.pool(hs[layer - 1], mask, "mean").numpy(), "you pooled hidden_states[layer - 1]: "
                "index 0 of hidden_states is the embedding output, so decoder layer l's output is hidden_states[l]. "
                + READ_PROBE),
        Mistake("padding pooled", h.mean(1).numpy(), "you averaged over every position, padding included: a padded row's "
                "features then depend on how much padding its batch needed. Weight by the attention mask and divide by "
                "the number of real tokens. " + READ_PROBE),
        Mistake("last column", h[:, -1].numpy(), "you took the last column's state; the features are the mean over the "
                "real tokens, and in a padded row the last column is padding. " + READ_PROBE),
        Mistake("last real token", h[rows, last].numpy(), "you took the state at each row's last real token; these "
                "features are the mean over all its real tokens (the lesson's search tries the last token too, as a "
                "separate pooling). " + READ_PROBE),
        Mistake("first token", h[:, 0].numpy(), "you took the first column's state; the features are the mean over "
                "the real tokens. " + READ_PROBE),
        Mistake("sum", (h * m[..., None]).sum(1).numpy(), "you summed over the real tokens without dividing by their "
                "number: longer tickets then get larger features. " + READ_PROBE),
    ])}


# --------------------------------------------------------------------------- P10: the probe's training, by hand


def _fit_variant(features, labels, classes, steps, lr, variant: str = "right") -> tuple[np.ndarray, np.ndarray]:
    """The probe's gradient descent with one known mistake (``variant``), as cheap.train_probe otherwise."""
    if variant == "labels misaligned (sorted)":
        classes = sorted(set(labels))
    elif variant == "labels misaligned (order seen)":
        classes = list(dict.fromkeys(labels))
    if variant == "sum, not mean":
        lr = lr * len(labels)
    if variant == "gradient ascent":
        lr = -lr
    X = torch.as_tensor(features, dtype=torch.float32)
    Y = torch.nn.functional.one_hot(torch.tensor([list(classes).index(lab) for lab in labels]), len(classes)).float()
    W, b = torch.zeros(X.shape[1], len(classes)), torch.zeros(len(classes))
    for _ in range(steps):
        Z = X @ W + b
        dZ = ((Z if variant == "logits for probabilities" else torch.softmax(Z, dim=1)) - Y) / X.shape[0]
        W -= lr * (X.T @ dZ)
        if variant != "no bias":
            b -= lr * dZ.sum(0)
    return W.numpy(), b.numpy()


def _probe_fit_case(seed: int, n: int, h: int, classes: list[str], steps: int, lr: float) -> dict:
    """Standardized random features [n, h] whose labels shift the mean. Every class occurs, in unequal numbers (so
    the bias has a gradient), and the labels first occur in an order other than ``classes``'s."""
    g = np.random.default_rng(seed)
    k = len(classes)
    counts = np.ones(k, dtype=int) + np.bincount(g.choice(k, n - k, p=np.arange(1, k + 1) / (k * (k + 1) / 2)), minlength=k)
    labels = [c for c, m in zip(classes, counts) for _ in range(m)]
    g.shuffle(labels)
    while list(dict.fromkeys(labels)) == list(classes):
        g.shuffle(labels)
    centre = g.normal(size=(k, h))
    x = g.normal(size=(n, h)) + 1.5 * centre[[classes.index(lab) for lab in labels]]
    x = (x - x.mean(0)) / x.std(0)
    return {"features": torch.tensor(x, dtype=torch.float32), "labels": labels, "classes": list(classes),
            "steps": steps, "lr": lr}


def _p10_reference(features, labels, classes, steps, lr):
    W, b = cheap.train_probe(features, labels, classes, steps, lr)
    return W.numpy(), b.numpy()


def _p10_public() -> list[Case]:
    return [Case(_probe_fit_case(0, 7, 3, ["software", "hardware", "network"], 1, 0.5),
                 "one step: 7 tickets, 3 features, 3 classes (not in alphabetical order)"),
            Case(_probe_fit_case(1, 12, 4, ["network", "billing", "software", "access"], 25, 0.3),
                 "25 steps: 12 tickets, 4 features, 4 classes")]


def _p10_hidden(rng: np.random.Generator) -> list[Case]:
    out = []
    for _ in range(3):
        k = int(rng.integers(3, 7))
        classes = [str(c) for c in rng.permutation(list(LABELS))[:k]]
        if classes == sorted(classes):
            classes = classes[::-1]
        out.append(Case(_probe_fit_case(int(rng.integers(0, 10_000)), int(rng.integers(2 * k, 5 * k)), int(rng.integers(2, 7)),
                                        classes, int(rng.integers(2, 40)), float(rng.choice([0.1, 0.3, 0.5])))))
    return out


_P10_WHY = {
    "no bias": "your b never moves: the bias gets its gradient too, Σ_n dZ[n] (the sum over the batch of each "
               "ticket's P − Y), and without it every class starts from the same offset however rare it is.",
    "labels misaligned (sorted)": "your columns follow the labels in alphabetical order, not the order of "
                                  "`classes`: column j of W and entry j of b belong to classes[j], so Y's one-hot "
                                  "column for a label is classes.index(label).",
    "labels misaligned (order seen)": "your columns follow the labels in the order they first occur in `labels`, not "
                                      "the order of `classes`: column j of W and entry j of b belong to classes[j], "
                                      "so Y's one-hot column for a label is classes.index(label).",
    "sum, not mean": "your step is N times too large: the loss is the mean cross-entropy, so dZ = (P − Y) / N, not "
                     "P − Y.",
    "gradient ascent": "your W and b move up the gradient: a descent step subtracts lr times it (W ← W − lr·Xᵀ dZ), "
                       "and dZ = (P − Y) / N, not (Y − P) / N.",
    "logits for probabilities": "you used the logits Z where the softmax probabilities P belong: the gradient of the "
                                "cross-entropy with respect to Z is (softmax(Z) − Y) / N.",
}


def _p10_mistakes(kw: dict, got: dict) -> dict:
    variants = {v: _fit_variant(**kw, variant=v) for v in _P10_WHY}
    return {out: worded([Mistake(v, val[i], why + " " + READ_PROBE) for v, val in variants.items()
                         for why in (_P10_WHY[v],)])
            for i, out in enumerate(("W", "b"))}


# --------------------------------------------------------------------------- P12: McNemar's threshold as a function of d

READ_PAIRED = "Reread '3. The evidence: the ladder with QLoRA on it' in The run."


def smallest_significant_gain(d: int, alpha: float = 0.05, two_sided: bool = True) -> int:
    """P12's reference: the smallest gain g = a_only − b_only (tickets) at which McNemar's exact test on d
    discordant tickets gives p < alpha. a_only = (d + g) / 2 of them fall QLoRA's way, so g has d's parity; a ticket
    both models got right or both got wrong falls no way under the null and does not enter the test. Two-sided, the
    p of ``paired.mcnemar_exact`` (min(1, 2 · P(X ≤ min(a_only, b_only))), X ~ Binomial(d, ½); McNemar 1947); one-sided,
    the upper binomial tail alone. d: an int ≥ 1. Raises ValueError when no split of d tickets reaches alpha
    (d ≤ 5 at 0.05, two-sided)."""
    for a in range(d // 2 + 1, d + 1):
        if two_sided:
            p = paired.mcnemar_exact([True] * a + [False] * (d - a), [False] * a + [True] * (d - a))["p_value"]
        else:
            p = sum(math.comb(d, i) for i in range(a, d + 1)) / 2 ** d
        if p < alpha:
            return 2 * a - d
    raise ValueError(f"the two models disagree on only {d} tickets: no split of them reaches p < {alpha}")


def _chi2_gain(d: int) -> int:
    """The smallest gain with d's parity at which McNemar's χ² statistic without continuity correction, g² / d,
    exceeds the 95 % point of χ² with one degree of freedom (1.96², McNemar 1947): the large-sample test a student may
    reach for instead of the exact one."""
    g = d % 2
    while g * g / d <= 1.959963984540054 ** 2:
        g += 2
    return g


def _p12_public() -> list[Case]:
    # d = 100 tells the exact two-sided key (22) from the one-sided tail (18) and the χ² approximation (20)
    return [Case({"d": 100}, "100 discordant tickets"), Case({"d": 73}, "73 discordant tickets (an odd d)")]


def _p12_hidden(rng: np.random.Generator) -> list[Case]:
    # 6: the fewest tickets that can reach p < 0.05; 44: where χ² with Yates's continuity correction is one step short
    return [Case({"d": int(d)}) for d in (6, 44, *rng.choice(np.arange(30, 200), size=3, replace=False))]


def _p12_mistakes(kw: dict, got: dict) -> dict:
    d = kw["d"]
    g = smallest_significant_gain(d)
    two = ("McNemar's test here is two-sided, so an equal gain for the tuned prompt counts as much, and it is the "
           "exact binomial test on the d discordant tickets. " + READ_PAIRED)
    one_sided, chi2 = smallest_significant_gain(d, two_sided=False), _chi2_gain(d)
    # Both are named by their own label on every d, also where their thresholds coincide (then a case's answer
    # equals both, and the class report keeps the label every failed case shares: the one the student used).
    if one_sided == chi2:
        both = ("that is where the one-sided tail (QLoRA's side alone) drops below 0.05, and also where the χ² "
                "approximation g² / d first exceeds 1.96²; " + two)
        tests = [("one-sided", one_sided, both), ("χ² approximation", chi2, both)]
    else:
        tests = [("one-sided", one_sided, "that is where the one-sided tail (QLoRA's side alone) drops below 0.05; " + two),
                 ("χ² approximation", chi2,
                  "that is where the χ² approximation g² / d first exceeds 1.96²; with this few tickets use the exact "
                  "binomial test on the d discordant tickets, as paired.mcnemar_exact does. " + READ_PAIRED)]
    out = [Mistake(name, value, text) for name, value, text in tests if abs(value - g) >= 1]
    right_only = (d + g) // 2
    if all(abs(right_only - t) >= 1 for t in (g, one_sided, chi2)):  # integers: 1 apart or more
        out.append(Mistake("right-only count", right_only,
                           "that is how many of the discordant tickets QLoRA alone would get right at the threshold; "
                           "the gain subtracts the tuned prompt's right-only tickets, d minus that many. " + READ_PAIRED))
    return {"result": worded(out)}


# --------------------------------------------------------------------------- the items


# Seconds the honest perfect submission takes to execute and score on the course's 2-core test machine
# (benchmarks/bench_budgets.py); each submission's time budget is made from it (coursekit.grading.budget).
COST_S = 45

ITEMS = {
    "w1": Choice("what the optimizer updates in QLoRA", 0,
        key="a",
        explain={
            "a": "get_peft_model freezes the base and attaches the adapters, so the only tensors with requires_grad are the lora_A and lora_B factors, and the optimizer is AdamW over exactly those. The NF4 codes get no gradient, and the norms, though cast to float32 by prepare_model_for_kbit_training, stay frozen: the preflight checks that every parameter without lora_ in its name is bit-identical after a step. (Lesson 19, 'Step 3: the training loop'.)",
            "b": "The NF4 codes are frozen: no gradient is formed for them and no optimizer holds them (lesson 16).",
            "c": "Only the adapter factors are trainable; the base stays frozen in 4 bits.",
            "d": "prepare_model_for_kbit_training casts the norms to float32 (with the embedding: every parameter left in 16 bits), but it does not make them trainable.",
        },
    ),
    "w2": Choice("why a split of unseen symptoms", 0,
        key="d",
        explain={
            "a": "That split's wordings are new, and the model got every ticket of it right: new wording did not stop it. What the split keeps the same is the symptom each ticket names.",
            "b": "A held-out split proves only what it keeps out of training. This one keeps out wordings and machines, not the cues that carry the category: see 'The data: one training split, two held-out splits'.",
            "c": "The machines in that split are new too, and the model still scored 100 %: the machine's name did not mislead it.",
            "d": "That split keeps out sentence templates and machines, but its symptoms are the training symptoms, so the cue words that carry the category (\"gearbox grinds\") were all seen in training; a model can score 100 % by recognising those learned cues. Whether it learned the categories themselves is tested only by tickets whose cue words, such as thermocouple, RCD or sludge, never occur in training. (Lesson 19, 'The data: one training split, two held-out splits'.)",
        },
    ),
    "w3": Choice("which baseline to beat", 0,
        key="b",
        explain={
            "a": "That prompt never names the labels, so an untrained model cannot answer it with one: beating it shows only that training taught the format. See 'The bar to beat'.",
            "b": "A fine-tune costs data, compute and an artifact to maintain, so it must beat the best you could get without it: the prompts a reasonable person writes first (zero-shot with label definitions, few-shot, label scoring with no training), and the cheap models that send no gradient through the language model (a bag of words, nearest neighbours, a linear probe on the frozen base's hidden states), each tuned on training tickets only, then scored on the same held-out tickets with the same rule, with 95 % intervals and a paired test. Beating the training prompt, which never names the labels, shows only that training taught the format. (Lesson 19, 'The bar to beat' and 'The cheap alternatives: what else QLoRA must beat'.)",
            "c": "A random guess is a floor, not the competition: a good prompt, or a linear probe on the frozen model, often beats it without any fine-tuning. See 'The bar to beat'.",
            "d": "They do need the labelled tickets, and that is why they are the bar: a fine-tune needs the same tickets, and once you have them a bag of words or a probe on the frozen base costs seconds, not a training run. The bar is the best of everything that sends no gradient through the language model. (Lesson 19, 'The cheap alternatives: what else QLoRA must beat'.)",
        },
    ),
    "p1": LoadItem("implement load_for_lora (the recipe in four calls)", 3, "load_for_lora"),
    "p2": PreflightItem("implement preflight", 3, "preflight"),
    "p3": OptimizerItem("implement adapter_optimizer", 1, "adapter_optimizer"),
    "p4": TrainItem("implement train_steps", 3, "train_steps"),
    "p5": Function("implement answer_logprobs", 2, name="answer_logprobs", reference=ceval.answer_logprobs,
                   public=_p5_public, hidden=_p5_hidden, outputs=("result",), mistakes=_p5_mistakes,
                   rtol=1e-4, atol=1e-5,
                   withheld=("coursekit.evaluate:answer_logprobs", "coursekit.recipe:answer_logprobs")),
    "p6": FirstWordItem("implement first_word", 1),
    "p7": Function("implement confusion_matrix", 1, name="confusion_matrix", reference=ceval.confusion_matrix,
                   public=_p7_public, hidden=_p7_hidden, outputs=("result",), mistakes=_p7_mistakes, rtol=0, atol=0),
    "p8": MergeItem("implement merge_onto_w16", 2, "merge_onto_w16"),
    "p9": Function("implement probe_features (mean-pooled hidden states of one layer)", 2, name="probe_features",
                    reference=cheap.probe_features,
                    public=_p9_public, hidden=_p9_hidden, outputs=("result",), mistakes=_p9_mistakes,
                    rtol=1e-5, atol=1e-5, withheld=("coursekit.cheap:probe_features", "coursekit.cheap:pool",
                                                    "coursekit.cheap:layer_features")),
    "p10": Function("implement train_probe (the probe's gradient descent, by hand)", 2, name="train_probe",
                    reference=_p10_reference, public=_p10_public, hidden=_p10_hidden, outputs=("W", "b"),
                    mistakes=_p10_mistakes, rtol=1e-4, atol=1e-5,
                    withheld=("coursekit.cheap:train_probe", "coursekit.cheap:fit_probe")),
    "p11": Choice("what section 6's merge rows say about the merges onto W16 and onto dequant(W4)", 1, options="abcd",
                 multi=True),
    "p12": Function("implement smallest_significant_gain (McNemar's exact threshold for d discordant tickets)", 1,
                    name="smallest_significant_gain", reference=smallest_significant_gain, public=_p12_public,
                    hidden=_p12_hidden, outputs=("result",), mistakes=_p12_mistakes, rtol=0, atol=0, withheld=()),
    "p13": Choice("what decides McNemar's exact test on two adapters with overlapping intervals", 1),
    "p15": Ordering("from a 4-bit-trained adapter to one deployable model that computes what was trained", 2, labels={
        "attach": "attach the saved adapter",
        "dequantize": "load the NF4 base and dequantize it to bf16",
        "merge": "merge sAB into the dequantized weights and unload the adapter",
        "save": "save the adapter with its base identity",
        "train": "train the adapter against the NF4 base",
        "verify": "verify greedily against the unmerged model on held-out tickets",
    }),
}
