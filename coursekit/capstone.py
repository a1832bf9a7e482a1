"""The capstone experiment: a real QLoRA run on the embedded base, judged against honest alternatives.

One pipeline, two users. Lesson 19 runs it with the student's own functions (a :class:`Recipe` of the
recipe loader, preflight, optimizer, training loop, the two scoring rules and the merge); ``coursekit
capstone`` runs it with coursekit's reference functions (:data:`REFERENCE`). The steps:

1. :func:`prompt_search` and :func:`baseline_ladder`: the untrained NF4 base with the best prompt a careful
   engineer would find. Every prompt layout (:data:`coursekit.data.prompts.LAYOUTS`: definitions in the user or
   the system turn, zero-shot or with six solved tickets) with every reading (:data:`RULES`: generation, and
   four readings of label scoring) is scored on tickets of the **training** split; the best pair, and the best
   with generation, are then evaluated on both held-out splits. Held-out tickets never choose a prompt.
2. :func:`train_run`: one adapter per entry of :data:`RUNS`: QLoRA (NF4 base), LoRA on the bf16 base (the
   bf16 decode of the Q4_1 GGUF file the model ships as, not a 16-bit original) with
   the same configuration and data, and one ablation (adapters on q_proj and v_proj only). Each records
   its loss curve, seconds per step and the resident memory its load-and-train added.
3. :func:`heldout_results`: each adapter on both held-out splits, label scoring and (for QLoRA) greedy
   generation.
4. :func:`merge_comparison`: the trained QLoRA adapter reloaded on a fresh NF4 base (identical logits?),
   then merged onto W16 (bf16, the recipe most tutorials give), onto dequant(W4) and into NF4 itself: logit
   differences and greedy agreement against the function that was trained.

Every result is stored on disk (:class:`Store`) under a key made of what determines it (base checkpoint,
data, configuration, adapter bytes, and the fingerprints of the recipe functions that computed it,
:func:`coursekit.fingerprint.code_fingerprint`), so a second run of the lesson, the grader and the tests reuse it,
and a function changed since gets its results computed again. :data:`REFERENCE` is lesson 19's model answer
(``coursekit.recipe``): a student's code that equals it shares its results, any other code gets its own run,
and the reference's results reach a notebook only where it asks for them by name (``mine = capstone.REFERENCE``).
Inside ``nbgrader autograde`` the store only reads, and reads the reference's results: grading never trains
(``coursekit grade`` runs :func:`run` with the reference recipe first if anything is missing).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import gc
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from . import data as cdata
from . import evaluate as ceval
from . import memory as cmemory
from . import model as cmodel
from . import train as ctrain
from .data import prompts as cprompts
from .fingerprint import code_fingerprint

__all__ = [
    "CONFIG",
    "RUNS",
    "SHOTS",
    "RULES",
    "LAYOUT_NAMES",
    "search_examples",
    "prompt_search",
    "best_prompt",
    "tuned_baseline",
    "Recipe",
    "REFERENCE",
    "DEPENDS_ON",
    "recipe_key",
    "Store",
    "CacheMiss",
    "baseline_ladder",
    "TrainedRun",
    "train_run",
    "stored_run",
    "peak_memory",
    "heldout_results",
    "merge_comparison",
    "scored_against",
    "run",
    "RUN_LABELS",
    "SCORING_LABELS",
    "paired_comparisons",
    "format_report",
]

#: The QLoRA configuration: r 16, lora_alpha 32 on every linear layer, AdamW lr 1e-3, 40 steps of 8 tickets
#: (320 tickets, a little under one pass over the 360 training tickets).
CONFIG = ctrain.TrainConfig(r=16, lora_alpha=32, target_modules="all-linear", lr=1e-3, steps=40, micro_batch=8,
                            accumulation=1, warmup_steps=3)

#: name → (quantize the base?, configuration, what it is). One variable differs from "qlora" in each.
RUNS: dict[str, tuple[bool, ctrain.TrainConfig, str]] = {
    "qlora": (True, CONFIG, "QLoRA: NF4 base, adapters on all linear layers"),
    "lora_bf16": (False, CONFIG, "LoRA on the bf16 base, same configuration"),
    "qlora_qv": (True, dataclasses.replace(CONFIG, target_modules=["q_proj", "v_proj"]),
                 "QLoRA, adapters on q_proj and v_proj only"),
}


#: Solved training tickets in the few-shot layouts (one per label).
SHOTS = 6
#: The readings the baseline search tries: greedy generation read by its first word, and every reading of one
#: label-scoring pass (``coursekit.evaluate.LABEL_RULES``). name → how tables print it.
RULES: dict[str, str] = {"generate": "generation", **ceval.LABEL_RULES}
#: How tables print each layout: where the instruction and the definitions go, and whether solved tickets follow.
LAYOUT_NAMES: dict[str, str] = {
    "definitions": "user turn, zero-shot",
    "system_definitions": "system turn, zero-shot",
    "few_shot": f"user turn, {SHOTS} shots",
    "system_few_shot": f"system turn, {SHOTS} shots",
}
#: Training tickets per training symptom that the baseline search scores (the first ones in training order).
SEARCH_PER_SYMPTOM = 2


@dataclass(frozen=True)
class Recipe:
    """The functions a run is built from (lesson 19 writes each; the signatures are the lesson's).

    load_for_lora(path, r, lora_alpha, target_modules, quantize) → PeftModel, only the adapter trainable;
    preflight(model, batch, optimizer) → anything, raising on a failed check;
    adapter_optimizer(model, lr, weight_decay) → torch optimizer;
    train_steps(model, windows, optimizer, scheduler, progress) → per-step losses (a list, or a dict with "loss");
    answer_logprobs(logits, labels) → per-row log-likelihood [R];
    first_word(text) → str;
    merge_onto_w16(adapter_dir, path) → a merged plain model.
    """

    name: str
    load_for_lora: Callable
    preflight: Callable
    adapter_optimizer: Callable
    train_steps: Callable
    answer_logprobs: Callable
    first_word: Callable
    merge_onto_w16: Callable

    def missing(self) -> list[str]:
        """The functions of this recipe not written yet: a fresh lesson's blanks (see coursekit.grading.unanswered)."""
        from .grading import unanswered

        return [f.name for f in dataclasses.fields(self) if f.name != "name" and unanswered(getattr(self, f.name))]

    def or_reference(self) -> "Recipe":
        """This recipe with coursekit's reference in place of every function not written yet (:meth:`missing`), so
        that a lesson run top to bottom before all its answers are in still shows the whole experiment."""
        gaps = self.missing()
        if not gaps:
            return self
        return dataclasses.replace(self, name=f"{self.name}, with coursekit's {', '.join(gaps)}",
                                   **{g: getattr(reference_recipe(), g) for g in gaps})


def _reference_preflight(model, batch, optimizer):
    return ctrain.preflight(model, batch, optimizer=optimizer, trainable=lambda n: "lora_" in n)


@functools.cache
def reference_recipe() -> Recipe:
    """coursekit's own functions, also ``capstone.REFERENCE``: lesson 19's model answers (``coursekit.recipe``) and
    coursekit's preflight (which decides no result). What ``coursekit capstone`` and the grader's cache use.
    Built on first use, because ``coursekit.recipe`` imports transformers and PEFT (seconds), which a grader that
    only reads the store does not need."""
    from . import recipe as crecipe

    return Recipe("coursekit's reference recipe", crecipe.load_for_lora, _reference_preflight,
                  crecipe.adapter_optimizer, crecipe.train_steps, crecipe.answer_logprobs, crecipe.first_word,
                  crecipe.merge_onto_w16)


def __getattr__(name: str) -> Any:
    if name == "REFERENCE":  # capstone.REFERENCE: the reference recipe, built on first use
        return reference_recipe()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: The recipe functions each kind of stored result depends on: their fingerprints are part of its key.
DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "runs": ("load_for_lora", "adapter_optimizer", "train_steps"),
    "labels": ("answer_logprobs",),
    "generate": ("first_word",),
    "merges": ("merge_onto_w16",),
}


def recipe_key(recipe: Recipe, store: "Store", kind: str) -> dict[str, str]:
    """``{function name: code_fingerprint}`` of the functions of ``recipe`` that results of ``kind`` depend on
    (:data:`DEPENDS_ON`; a search or baseline result depends on both scoring rules). A store that may not compute
    (inside ``nbgrader autograde``) reads the :data:`REFERENCE`'s results whatever the recipe: the grader asks for
    them by name, and never trains. Raises KeyError for an unknown kind."""
    names = DEPENDS_ON["labels"] + DEPENDS_ON["generate"] if kind == "prompts" else DEPENDS_ON[kind]
    source = recipe if store.compute else reference_recipe()
    return {n: code_fingerprint(getattr(source, n)) for n in names}


# --------------------------------------------------------------------------- the store


class CacheMiss(RuntimeError):
    """A result is not in the store and this store may not compute it (inside ``nbgrader autograde``)."""


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _writable(folder: Path) -> bool:
    """Whether this process may make files in ``folder`` or, if it does not exist yet, in its nearest existing parent
    (false on a read-only mount, also for root)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK)


def data_key(seed: int = 0) -> str:
    """A hash of the three splits' examples: results from other data never match."""
    splits = cdata.make_splits(seed)
    return _digest({k: [[ex["id"], ex["ticket"], ex["label"]] for ex in v] for k, v in splits.items()})


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


#: Bumped whenever a stored result's fields change, so that results written by an older coursekit are not read.
STORE_VERSION = 1


class Store:
    """Results on disk under ``<cache>/capstone/v<STORE_VERSION>-<base checkpoint>-<data>/<kind>/<key hash>``.

    root: folder (default: under ``coursekit.model.cache_root()``). compute: whether a missing result may
    be computed (default: not inside ``nbgrader autograde``). fresh: recompute and overwrite what is there
    (lesson 19's ``RECOMPUTE``; ``coursekit capstone --retrain``). Concurrent processes (two grading workers,
    a lesson and a test) wait for each other on a per-result lock (``filelock``) and then reuse the result.
    """

    def __init__(self, root: str | Path | None = None, compute: bool | None = None, fresh: bool = False):
        if compute is None:
            from .grading import autograding

            compute = not autograding()
        if root is None:
            if compute and not cmodel.default_checkpoint_dir().exists():  # a fresh machine: the store is named by
                cmodel.prepare_model(progress=False)  # the checkpoint (written whole: an existing folder has its manifest)
            sha = list(ctrain.base_identity()["checkpoint_files"].values())[0][:12]
            root = cmodel.cache_root() / "capstone" / f"v{STORE_VERSION}-{sha}-{data_key()}"
        self.root, self.compute, self.fresh = Path(root), compute, fresh
        self._refreshed: set[Path] = set()
        #: How many results this store object computed and how many it read (a run is cold when it read none).
        self.counts = {"computed": 0, "read": 0}

    def folder(self, kind: str, key: dict) -> Path:
        """The folder of one result; ``key`` (JSON-able) is written beside it as key.json."""
        return self.root / kind / _digest(key)

    @contextlib.contextmanager
    def locked(self, folder: Path) -> Iterator[bool]:
        """Hold the result's lock; yields whether the result must be (re)computed here."""
        with self._locked(folder) as todo:
            self.counts["computed" if todo else "read"] += 1
            yield todo

    @contextlib.contextmanager
    def _locked(self, folder: Path) -> Iterator[bool]:
        from filelock import FileLock

        if not self.compute and not self.fresh and (folder / "result.json").is_file():
            yield False  # a finished result is only read (written whole, last): no lock, so a read-only store works
            return
        if not self.compute and not _writable(folder.parent):  # a read-only store (the grading sandbox): no lock to
            raise self._miss(folder)                             # take, and nothing may be computed here
        folder.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder) + ".lock"):
            done = (folder / "result.json").is_file()
            if self.fresh and folder not in self._refreshed:
                done = False
            if not done and not self.compute:
                raise self._miss(folder)
            yield not done

    def _miss(self, folder: Path) -> CacheMiss:
        return CacheMiss(f"{folder.relative_to(self.root)} is not in the capstone store and this run may not "
                         f"compute it (nbgrader autograde never trains). Run `coursekit capstone` once on this "
                         f"machine first (coursekit grade does so itself).")

    def result(self, kind: str, key: dict, compute: Callable[[], dict], by: str) -> dict:
        """The stored result for (kind, key), computing and storing it (with who computed it and when) if missing."""
        folder = self.folder(kind, key)
        with self.locked(folder) as todo:
            if not todo:
                return {**json.loads((folder / "result.json").read_text()), "cached": True}
            t0 = time.perf_counter()
            out = {**compute(), "seconds": time.perf_counter() - t0}
            self.write(folder, key, out, by)
            return {**out, "cached": False, "by": by}

    def write(self, folder: Path, key: dict, out: dict, by: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "key.json").write_text(json.dumps(key, indent=1, default=str) + "\n")
        record = {**out, "by": by, "when": time.strftime("%Y-%m-%d %H:%M")}
        tmp = folder / "result.json.tmp"
        tmp.write_text(json.dumps(record, default=str) + "\n")
        tmp.replace(folder / "result.json")
        self._refreshed.add(folder)


# --------------------------------------------------------------------------- 1. baselines


def search_examples(per_symptom: int = SEARCH_PER_SYMPTOM) -> list[dict]:
    """The training tickets the baseline search scores: the first ``per_symptom`` of every training symptom, in
    training order (2 × 60 = 120 by default), leaving out the few-shot layouts' solved tickets (a ticket scored
    with its own answer in the prompt would flatter those layouts). Every symptom and so every label is
    represented equally; no held-out ticket is among them. Raises ValueError for per_symptom < 1."""
    if not isinstance(per_symptom, int) or per_symptom < 1:
        raise ValueError(f"per_symptom must be a positive integer, got {per_symptom!r}")
    shots = {ex["id"] for ex in cprompts.few_shot_examples(SHOTS)}
    seen: dict[str, int] = {}
    out = []
    for ex in cdata.load_split("train"):
        if ex["id"] not in shots and seen.get(ex["symptom"], 0) < per_symptom:
            seen[ex["symptom"]] = seen.get(ex["symptom"], 0) + 1
            out.append(ex)
    return out


def _base_key(layout: str) -> dict:
    return {"model": "nf4 base", "base": ctrain.base_identity()["checkpoint_files"], "layout": layout,
            "shots": SHOTS if "few_shot" in layout else 0, "matmul": _matmul()}


def _all_rules(base_model: Callable[[], torch.nn.Module], tokenizer, examples: list[dict], layout: str, recipe: Recipe,
               progress: bool, desc: str, rules: tuple[str, ...]) -> dict[str, dict]:
    shots = cprompts.few_shot_examples(SHOTS)
    out: dict[str, dict] = {}
    if "generate" in rules:
        out["generate"] = ceval.evaluate(base_model(), tokenizer, examples, "generate", layout, shots, progress=progress,
                                         desc=f"{desc}, generation", first_word=recipe.first_word)
    if any(r in ceval.LABEL_RULES for r in rules):
        out.update(ceval.evaluate_label_rules(base_model(), tokenizer, examples, layout, shots, progress=progress,
                                              desc=f"{desc}, label scoring", logprob_fn=recipe.answer_logprobs))
    return out


def _lazy_base(base: torch.nn.Module | None) -> Callable[[], torch.nn.Module]:
    held = [base]

    def get() -> torch.nn.Module:
        if held[0] is None:
            held[0] = for_this_cpu(cmodel.load_model("nf4"))
        return held[0]
    return get


def prompt_search(tokenizer, store: Store, recipe: Recipe | None = None, base: torch.nn.Module | None = None,
                  progress: bool = True) -> dict[str, dict[str, dict]]:
    """Every prompt layout with every reading of :data:`RULES` on :func:`search_examples` (training tickets only):
    ``{layout: {rule: result}}`` (results as :func:`coursekit.evaluate.evaluate` returns them). One generation pass
    and one label-scoring pass per layout. ``base``: the untrained NF4 model, loaded here only if a result is
    missing."""
    recipe = recipe or reference_recipe()
    return _prompt_search(tokenizer, store, recipe, _lazy_base(base), progress)


def _prompt_search(tokenizer, store: Store, recipe: Recipe, get: Callable[[], torch.nn.Module],
                   progress: bool) -> dict[str, dict[str, dict]]:
    examples = search_examples()
    key_examples = _digest([ex["id"] for ex in examples])
    code = recipe_key(recipe, store, "prompts")
    return {layout: store.result("search", {**_base_key(layout), "examples": key_examples, "rules": list(RULES),
                                            "code": code},
                                 lambda layout=layout: _all_rules(get, tokenizer, examples, layout, recipe, progress,
                                                                  f"search: {layout}", tuple(RULES)),
                                 recipe.name)
            for layout in cprompts.LAYOUTS}


def best_prompt(search: dict[str, dict[str, dict]], rules: tuple[str, ...] | None = None) -> tuple[str, str]:
    """The (layout, rule) with the highest accuracy in a :func:`prompt_search` result, among ``rules`` (default:
    all). Ties go to the first in the search's order (layouts as listed, rules as in :data:`RULES`), so the choice
    is deterministic. Raises ValueError when no result matches."""
    pairs = [(layout, rule) for layout, by_rule in search.items() for rule in RULES
             if rule in by_rule and (rules is None or rule in rules)]
    if not pairs:
        raise ValueError(f"no search result for the rules {rules}")
    return max(pairs, key=lambda lr: (search[lr[0]][lr[1]]["accuracy"], -pairs.index(lr)))


def rung_name(layout: str, rule: str) -> str:
    """A baseline's name in tables: its layout and its reading."""
    return f"prompt tuned on train: {LAYOUT_NAMES[layout]}, {RULES[rule]}"


def baseline_ladder(tokenizer, store: Store, recipe: Recipe | None = None, base: torch.nn.Module | None = None,
                    progress: bool = True) -> dict[str, dict[str, dict]]:
    """The baselines on both held-out splits: ``{rung name: {split: result}}``, results as
    :func:`coursekit.evaluate.evaluate` returns them plus ``"layout"`` and ``"rule"``.

    The first rung is the search's overall best (:func:`best_prompt` on :func:`prompt_search`, chosen on training
    tickets): the baseline a fine-tune must beat (:func:`tuned_baseline`). The second, when the best is not already
    a generation rule, is the best prompt read by generation: what a user of the untrained model would see."""
    recipe = recipe or reference_recipe()
    get = _lazy_base(base)
    search = _prompt_search(tokenizer, store, recipe, get, progress)
    code = recipe_key(recipe, store, "prompts")
    chosen = [best_prompt(search)]
    if chosen[0][1] != "generate":
        chosen.append(best_prompt(search, ("generate",)))
    out: dict[str, dict[str, dict]] = {}
    for layout, rule in chosen:
        wanted = ("generate",) if rule == "generate" else tuple(ceval.LABEL_RULES)
        out[rung_name(layout, rule)] = {}
        for split in cdata.HELDOUT_SPLITS:
            key = {**_base_key(layout), "split": split, "rules": list(wanted), "code": code}
            res = store.result("baselines", key, lambda layout=layout, split=split, wanted=wanted: _all_rules(
                get, tokenizer, cdata.load_split(split), layout, recipe, progress, f"{layout}, {split}", wanted),
                recipe.name)
            out[rung_name(layout, rule)][split] = {**res[rule], "layout": layout, "rule": rule,
                                                    "seconds": res.get("seconds", 0), "by": res.get("by")}
    return out


def tuned_baseline(ladder: dict[str, dict[str, dict]]) -> str:
    """The name of the rung the search chose on training tickets: the first of :func:`baseline_ladder`."""
    return next(iter(ladder))


# --------------------------------------------------------------------------- 2. training


def _matmul() -> str:
    """Name of the dtype this machine's capstone computes in (:func:`coursekit.model.matmul_dtype`)."""
    return str(cmodel.matmul_dtype()).removeprefix("torch.")


def for_this_cpu(model: torch.nn.Module) -> torch.nn.Module:
    """``model``, computing in :func:`coursekit.model.matmul_dtype`: unchanged where the CPU multiplies bf16 in
    hardware; elsewhere :func:`coursekit.model.compute_in_float32` (the weights keep their values, NF4 codes
    included; only the arithmetic widens), because emulated bf16 would make the run take hours there. Also sets
    torch's threads to the CPUs this process may use (:func:`coursekit.model.use_usable_cpus`)."""
    cmodel.use_usable_cpus()
    return cmodel.compute_in_float32(model) if cmodel.matmul_dtype() == torch.float32 else model


def _release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``), so that the next memory
    measurement starts from pages that are really in use (memory a previous model freed would otherwise be reused
    without showing up as growth)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _run_key(name: str, recipe: Recipe, store: "Store") -> dict:
    quantize, cfg, _ = RUNS[name]
    return {"quantize": quantize, "config": asdict(cfg), "base": ctrain.base_identity()["checkpoint_files"],
            "data": data_key(), "matmul": _matmul(), "code": recipe_key(recipe, store, "runs")}


def _losses(out: Any) -> list[float]:
    seq = out["loss"] if isinstance(out, dict) else out
    return [float(x) for x in seq]


@dataclass
class TrainedRun:
    """One trained adapter of :data:`RUNS`: its stored ``record`` and the model, loaded only when something needs it
    (``run.model``: ``recipe.load_for_lora`` on the embedded base, then the stored adapter weights)."""

    name: str
    record: dict
    recipe: Recipe
    _model: Any = None

    @property
    def adapter_dir(self) -> Path:
        return Path(self.record["adapter_dir"])

    @property
    def model(self):
        if self._model is None:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            quantize, cfg, _ = RUNS[self.name]
            torch.manual_seed(cfg.seed)
            model = for_this_cpu(self.recipe.load_for_lora(cmodel.prepare_model(progress=False), cfg.r,
                                                           cfg.lora_alpha, cfg.target_modules, quantize))
            set_peft_model_state_dict(model, load_file(str(self.adapter_dir / "adapter_model.safetensors")))
            self._model = model
        return self._model

    def release(self) -> None:
        """Drop the model (the record stays); the next ``run.model`` loads it again."""
        self._model = None
        _release_memory()


def train_run(name: str, tokenizer, store: Store, recipe: Recipe | None = None, progress: bool = True) -> TrainedRun:
    """Train the adapter of :data:`RUNS` ``[name]`` with ``recipe``, or find it in the store.

    Training: seed, ``recipe.load_for_lora`` (the embedded base), the training split cut into
    ``CONFIG.steps`` windows, ``recipe.adapter_optimizer``, a linear warm-up and decay schedule,
    ``recipe.preflight`` on the first micro-batch, then ``recipe.train_steps``; the adapter is saved with its
    base identity. Measured: seconds per step (the training call over its steps). Memory is measured apart, in a
    fresh process (:func:`peak_memory`). The record holds ``losses``, ``seconds_per_step``, ``footprint_mb``
    (parameters and buffers after loading), ``adapter_dir`` (where the store is now), ``adapter_sha``, ``by``
    (which recipe trained it), ``when`` and ``cached``.
    """
    recipe = recipe or reference_recipe()
    from transformers import get_linear_schedule_with_warmup

    quantize, cfg, _ = RUNS[name]
    key = _run_key(name, recipe, store)
    folder = store.folder("runs", key)
    adapter_dir = folder / "adapter"
    with store.locked(folder) as todo:
        if not todo:
            return TrainedRun(name, _stored_record(folder), recipe)
        path = cmodel.prepare_model(progress=False)
        windows = ctrain.make_windows(cdata.load_split("train"), tokenizer, cfg)

        def work():
            torch.manual_seed(cfg.seed)
            model = recipe.load_for_lora(path, cfg.r, cfg.lora_alpha, cfg.target_modules, quantize)
            footprint = cmodel.footprint(model)  # as the recipe loaded it, before any widening for this CPU
            for_this_cpu(model)
            opt = recipe.adapter_optimizer(model, cfg.lr, cfg.weight_decay)
            sched = get_linear_schedule_with_warmup(opt, cfg.warmup_steps, cfg.steps)
            recipe.preflight(model, windows[0][0], opt)
            t0 = time.perf_counter()
            losses = _losses(recipe.train_steps(model, windows, opt, sched, progress))
            return model, footprint, losses, time.perf_counter() - t0

        _release_memory()
        model, footprint, losses, seconds = work()
        ctrain.save_adapter(model, adapter_dir, cfg, extra={"data": key["data"], "run": name})
        record = {"name": name, "quantize": quantize, "config": asdict(cfg), "losses": losses,
                  "train_seconds": seconds, "seconds_per_step": seconds / cfg.steps, "footprint_mb": footprint / 1e6,
                  "adapter_sha": _file_sha(adapter_dir / "adapter_model.safetensors"),
                  "torch_threads": torch.get_num_threads(), "matmul_dtype": key["matmul"]}
        store.write(folder, key, record, recipe.name)
        return TrainedRun(name, {**record, "adapter_dir": str(adapter_dir), "cached": False, "by": recipe.name}, recipe, model)


def _stored_record(folder: Path) -> dict:
    """A stored run's record, with the adapter's folder where the store is now (the store may have moved)."""
    return {**json.loads((folder / "result.json").read_text()), "adapter_dir": str(folder / "adapter"), "cached": True}


MEMORY_STEPS = 2  # the second step is the steady state: AdamW's moments exist from the first step on


def _measure_memory(name: str, out: str, return_freed: bool) -> None:
    """In a fresh process: load :data:`RUNS` ``[name]``'s base with coursekit's recipe, train ``MEMORY_STEPS`` steps,
    and write the process's resident memory (before loading, and its peak) to the JSON file ``out``."""
    import logging

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    # glibc keeps freed blocks in its heap (its mmap threshold grows with the largest block freed), so resident
    # memory would also count what training freed long ago. A fixed 64 KiB threshold makes every larger block an
    # mmap of its own, handed back to the OS when freed: the peak then counts memory in use.
    fixed = False
    if return_freed:
        with contextlib.suppress(OSError, AttributeError):
            fixed = bool(ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024))  # M_MMAP_THRESHOLD
    quantize, cfg, _ = RUNS[name]
    tok = cmodel.load_tokenizer()
    path = cmodel.prepare_model(progress=False)
    windows = ctrain.make_windows(cdata.load_split("train"), tok, dataclasses.replace(cfg, steps=MEMORY_STEPS))
    def work():
        torch.manual_seed(cfg.seed)
        model = ctrain.load_for_lora(path, cfg.r, cfg.lora_alpha, cfg.target_modules, quantize)
        ctrain.train_steps(model, windows, ctrain.adapter_optimizer(model, cfg.lr, cfg.weight_decay), progress=False)
        return model

    _release_memory()
    before = cmemory.resident_bytes()
    model, growth = cmemory.peak_rss_delta(work, interval=0.005)
    # What the largest term should be, counted exactly: the tensors autograd saves for one step's backward.
    _, saved = cmemory.saved_activation_bytes(lambda: ctrain.supervised_loss_sum(model, windows[0][0]), exclude=model)
    Path(out).write_text(json.dumps({"rss_before_mb": before / 1e6, "peak_rss_mb": (before + growth) / 1e6,
                                     "peak_growth_mb": growth / 1e6, "footprint_mb": cmodel.footprint(model) / 1e6,
                                     "saved_activations_mb": saved / 1e6, "steps": MEMORY_STEPS,
                                     "allocator": "glibc, blocks over 64 KiB returned when freed" if fixed else "default"}))


def peak_memory(name: str, store: Store, return_freed: bool = True) -> dict:
    """Peak resident memory of training :data:`RUNS` ``[name]``, measured in a fresh Python process (spawned, so
    it shares no pages or allocator state with this one): ``rss_before_mb`` (Python, torch and the tokenizer,
    before the base is loaded), ``peak_rss_mb`` (the peak while loading the base and training ``MEMORY_STEPS``
    steps of the capstone's batches, :func:`coursekit.memory.peak_rss_delta`), ``peak_growth_mb`` (the
    difference), ``footprint_mb`` (parameters and buffers) and ``saved_activations_mb`` (what autograd saves for
    one step's backward, :func:`coursekit.memory.saved_activation_bytes`: exact, no allocator involved).

    Why not in this process: memory freed by earlier models stays in the allocator's heap and is reused without
    showing up as growth, so the same run measured after other work reads hundreds of MB lower. The fresh
    process runs coursekit's reference recipe (a notebook's functions cannot be sent to another process); both
    recipes hold the same tensors. With ``return_freed`` it also asks glibc to return every block over 64 KiB
    to the OS when freed (``mallopt(M_MMAP_THRESHOLD)``; ``allocator`` says whether that worked): with glibc's
    defaults a process keeps freed blocks, and its resident memory then depends on the order of its
    allocations, not only on the tensors alive. Linux only (``/proc``); elsewhere the values are None.
    """
    import subprocess
    import sys
    import tempfile

    def compute() -> dict:
        if cmemory.resident_bytes() is None:
            return {"rss_before_mb": None, "peak_rss_mb": None, "peak_growth_mb": None, "footprint_mb": None,
                    "saved_activations_mb": None, "steps": 0}
        with tempfile.TemporaryDirectory(prefix="coursekit-memory-") as tmp:
            out = Path(tmp) / "memory.json"
            # A new interpreter that imports coursekit and nothing of this process (not even its __main__).
            code = "import sys; from coursekit.capstone import _measure_memory; _measure_memory(sys.argv[1], sys.argv[2], sys.argv[3] == '1')"
            done = subprocess.run([sys.executable, "-c", code, name, str(out), "1" if return_freed else "0"],
                                  capture_output=True, text=True)
            if done.returncode != 0 or not out.is_file():
                raise RuntimeError(f"the memory measurement of {name} failed in its own process (exit code "
                                   f"{done.returncode}): {done.stderr.strip().splitlines()[-1:] or ''}")
            return json.loads(out.read_text())

    quantize, cfg, _ = RUNS[name]
    key = {"quantize": quantize, "config": asdict(cfg), "base": ctrain.base_identity()["checkpoint_files"],
           "steps": MEMORY_STEPS, "return_freed": return_freed}
    return store.result("memory", key, compute, "coursekit's reference recipe")


def stored_run(name: str, store: Store, recipe: Recipe | None = None) -> dict:
    """The record of :data:`RUNS` ``[name]`` as :func:`train_run` stored it for ``recipe``'s code, without loading
    any model. Raises :class:`CacheMiss` when it was never trained on this machine."""
    recipe = recipe or reference_recipe()
    folder = store.folder("runs", _run_key(name, recipe, store))
    if not (folder / "result.json").is_file():
        raise CacheMiss(f"the {name} run is not in the capstone store ({store.root}): run lesson 19 or `coursekit capstone`.")
    return _stored_record(folder)


# --------------------------------------------------------------------------- 3. held-out results


def heldout_results(run: TrainedRun, tokenizer, store: Store, scorings: tuple[str, ...] = ("labels",),
                    progress: bool = True) -> dict[str, dict[str, dict]]:
    """The trained model on both held-out splits, with the plain prompt it was trained with and ``run.recipe``'s
    scoring rules: ``{scoring: {split: result}}``. The model is loaded only if a result is missing."""
    out: dict[str, dict[str, dict]] = {}
    rec = run.record
    for scoring in scorings:
        out[scoring] = {}
        for split in cdata.HELDOUT_SPLITS:
            key = {"adapter": rec["adapter_sha"], "run": rec["name"], "style": "plain", "scoring": scoring, "split": split,
                   "matmul": _matmul(), "code": recipe_key(run.recipe, store, scoring)}
            out[scoring][split] = store.result("heldout", key, lambda scoring=scoring, split=split: ceval.evaluate(
                run.model, tokenizer, cdata.load_split(split), scoring, "plain", progress=progress,
                desc=f"{rec['name']}, {split}", first_word=run.recipe.first_word,
                logprob_fn=run.recipe.answer_logprobs), run.recipe.name)
    return out


# --------------------------------------------------------------------------- 4. reload and merge


MERGES: tuple[tuple[str, str], ...] = (
    ("onto W16 (bf16 base)", "the recipe most tutorials give: merge_onto_w16"),
    ("onto dequant(W4), in bf16", "the base the adapter was trained against, as plain bf16 weights"),
    ("into NF4 (re-quantized)", "PEFT's merge on the 4-bit model: W + sAB quantized again"),
)


def _codes(model) -> dict[str, torch.Tensor]:
    """The packed NF4 bytes of every 4-bit layer (by module name, PEFT's wrapper prefixes removed)."""
    import bitsandbytes as bnb

    return {n.replace("base_model.model.", "").replace(".base_layer", ""): m.weight.data.clone()
            for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}


def _changed_codes(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """Share of 4-bit codes (two per byte) that differ between two sets of packed weights."""
    changed = total = 0
    for name, a in before.items():
        b = after[name]
        changed += int(((a >> 4) != (b >> 4)).sum() + ((a & 15) != (b & 15)).sum())
        total += 2 * a.numel()
    return changed / total


def scored_against(pred: list[str], reference_pred: list[str] | None, examples: list[dict]) -> dict:
    """One model's per-ticket labels on ``examples`` (tickets with "id", "label", "symptom"), scored, and paired with
    the reference's labels on the same tickets.

    Returns ``{"n", "correct", "accuracy", "interval" (95 % Wilson, ``coursekit.evaluate.wilson_interval``),
    "predictions" ([{"id", "label", "pred"}], the form of ``coursekit.evaluate.evaluate``)}`` and, unless
    ``reference_pred`` is None, ``"paired"``: ``coursekit.paired.compare(this model, the reference, symptoms)``, so
    ``a_only`` counts the tickets only this model gets right (gained against the reference), ``b_only`` those only the
    reference gets right (lost), ``p_value`` is McNemar's exact p, ``interval`` resamples whole symptoms. Raises
    ValueError when the predictions and the tickets differ in number."""
    from . import paired

    if len(pred) != len(examples) or (reference_pred is not None and len(reference_pred) != len(examples)):
        raise ValueError(f"need one label per ticket: {len(pred)} labels"
                         + ("" if reference_pred is None else f" and {len(reference_pred)} reference labels")
                         + f" for {len(examples)} tickets")

    def result(labels: list[str]) -> dict:
        correct = sum(p == ex["label"] for p, ex in zip(labels, examples))
        return {"n": len(examples), "correct": correct, "accuracy": correct / len(examples),
                "interval": list(ceval.wilson_interval(correct, len(examples))),
                "predictions": [{"id": ex["id"], "label": ex["label"], "pred": p} for p, ex in zip(labels, examples)]}

    out = result(list(pred))
    if reference_pred is not None:
        out["paired"] = paired.compare(out, result(list(reference_pred)), {ex["id"]: ex["symptom"] for ex in examples})
    return out


def merge_comparison(run: TrainedRun, tokenizer, store: Store, split: str = "unseen_symptom") -> dict:
    """Reload the adapter of ``run`` on a fresh NF4 base, then compare three merged models with it on ``split``.

    Reload: ``run.model`` (the model that was trained, or ``run.recipe``'s load of it) against
    ``coursekit.train.load_nf4_with_adapter`` on a fresh base, on the same batches: the largest |logit
    difference| should be 0. The reference for the merges is that fresh reload: the function that was trained. Per
    merged model: the largest and mean |difference| of the logits that predict the first answer token
    (N × 49,152 values), the share of tickets whose greedy first answer token gives the reference's label (every
    label starts with its own token), the accuracy read off that token, the share whose greedy first token starts
    no label at all, and the share whose greedy first token is exactly the untrained base's (which answers
    "The …"). The untrained NF4 base, read the same way, is the row ``"base"`` beside them: what a merge that
    changed nothing would give. Every row also keeps its per-ticket labels and its paired test against the
    reference (:func:`scored_against`): two models on the same tickets are compared by McNemar's exact test on the
    discordant tickets (``coursekit.paired.compare``, as lesson 19's other paired lines), and every accuracy carries
    its n and a 95 % Wilson interval. Returns ``{"reload_max_abs_diff", "n", "base_accuracy", "reference_accuracy",
    "nf4_codes_changed", "reference": scored, "base": row, "merges": {name: row}}``, the reference ``{"n", "correct",
    "accuracy", "interval", "predictions"}`` (:func:`scored_against` without "paired"), each row those and
    ``{"max_abs_diff", "mean_abs_diff", "agreement", "no_label", "same_token_as_base", "paired"}``."""
    record, recipe = run.record, run.recipe
    key = {"adapter": record["adapter_sha"], "run": record["name"], "split": split, "matmul": _matmul(),
           "code": recipe_key(recipe, store, "merges"), "rows": "untrained base and three merges",
           # results stored before rows kept their per-ticket labels and paired test have another key: computed again
           "per_row": "per-ticket labels, Wilson interval, paired test against the reference"}

    def compute() -> dict:
        examples = cdata.load_split(split)
        prompts = ceval.encode_prompts(tokenizer, [cdata.prompt_messages(ex["ticket"]) for ex in examples])
        first = {tokenizer.encode(label, add_special_tokens=False)[0]: label for label in cdata.LABELS}

        def labels_of(logits: torch.Tensor) -> list[str]:
            return [first.get(t, "(other)") for t in logits.argmax(dim=-1).tolist()]

        def accuracy(pred: list[str]) -> float:
            return sum(p == ex["label"] for p, ex in zip(pred, examples)) / len(examples)

        adapter_dir = run.adapter_dir
        reloaded = for_this_cpu(ctrain.load_nf4_with_adapter(adapter_dir))
        ref = ceval.next_token_logits(reloaded, tokenizer, prompts)
        codes = _codes(reloaded)
        trained = ceval.next_token_logits(run.model, tokenizer, prompts)  # same batches, so the same arithmetic
        base_logits = ceval.next_token_logits(for_this_cpu(cmodel.load_model("nf4")), tokenizer, prompts)
        base_pred, base_tokens = labels_of(base_logits), base_logits.argmax(dim=-1)
        ref_pred = labels_of(ref)

        def row(logits: torch.Tensor) -> dict:
            pred, diff = labels_of(logits), (logits - ref).abs()
            return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
                    "agreement": sum(a == b for a, b in zip(pred, ref_pred)) / len(pred), "accuracy": accuracy(pred),
                    "same_token_as_base": float((logits.argmax(dim=-1) == base_tokens).float().mean()),
                    "no_label": sum(p == "(other)" for p in pred) / len(pred),
                    **scored_against(pred, ref_pred, examples)}

        out = {"reload_max_abs_diff": float((trained - ref).abs().max()), "n": len(examples),
               "reference_accuracy": accuracy(ref_pred), "base_accuracy": accuracy(base_pred),
               "reference": scored_against(ref_pred, None, examples), "base": row(base_logits), "merges": {}}
        path = cmodel.prepare_model(progress=False)
        builders = {MERGES[0][0]: lambda: recipe.merge_onto_w16(adapter_dir, path),
                    MERGES[1][0]: lambda: ctrain.merge_into_dequantized(adapter_dir),
                    MERGES[2][0]: lambda: ctrain.merge_nf4_model(reloaded)}
        for name, build in builders.items():
            merged = build()
            if name == MERGES[2][0]:
                out["nf4_codes_changed"] = _changed_codes(codes, _codes(merged))
            for_this_cpu(merged)  # after the merge: the merged weights are the recipe's, only the arithmetic widens
            out["merges"][name] = row(ceval.next_token_logits(merged, tokenizer, prompts))
            del merged
        return out

    return store.result("merges", key, compute, recipe.name)


# --------------------------------------------------------------------------- the whole run


def run(recipe: Recipe | None = None, store: Store | None = None, progress: bool = True, log: Callable = print) -> dict:
    """Every step above, in order, with the cheap rungs (``coursekit.cheap.ladder``) after the baselines; returns
    ``{"ladder", "cheap", "runs": {name: record}, "heldout": {name: results},
    "merge", "store": {"computed", "read"} (results this run computed and read), "matmul", "threads",
    "usable_cpus", "wall_seconds"}``. What ``coursekit capstone`` and ``coursekit grade`` (before grading lesson 19) run."""
    recipe = recipe or reference_recipe()
    t0 = time.perf_counter()
    store = store or Store()
    tok = cmodel.load_tokenizer()
    log(f"matmuls in {_matmul()}, {cmodel.use_usable_cpus()} torch threads ({cmodel.usable_cpus()} usable CPUs)")
    log("baselines: a prompt search on training tickets, then the chosen prompts on the held-out splits …")
    ladder = baseline_ladder(tok, store, recipe, progress=progress)
    from . import cheap

    log("cheap alternatives: bag of words, kNN and a probe on the frozen base, chosen by grouped CV on training tickets …")
    cheap_rungs = cheap.ladder(tok, store, progress=progress)
    runs, heldout, merge = {}, {}, None
    for name, (_, _, what) in RUNS.items():
        log(f"{what} …")
        trained = train_run(name, tok, store, recipe, progress)
        scorings = ("labels", "generate") if name == "qlora" else ("labels",)
        heldout[name] = heldout_results(trained, tok, store, scorings, progress)
        runs[name] = trained.record
        if name in ("qlora", "lora_bf16"):
            runs[name] = {**trained.record, "memory": peak_memory(name, store)}
        if name == "qlora":
            log("reload and merges …")
            merge = merge_comparison(trained, tok, store)
        trained.release()
    return {"ladder": ladder, "cheap": cheap_rungs, "runs": runs, "heldout": heldout, "merge": merge,
            "store": dict(store.counts),
            "matmul": _matmul(), "threads": cmodel.use_usable_cpus(), "usable_cpus": cmodel.usable_cpus(),
            "wall_seconds": time.perf_counter() - t0}


#: How tables name each run of :data:`RUNS` and each scoring rule (the console report and the README alike).
#: How tables name each run. "bf16 base" is the bf16 decode of the Q4_1 file the model ships as (lesson 18), not a
#: 16-bit original: the QLoRA-against-LoRA comparison is NF4(decoded Q4_1) against decoded Q4_1.
RUN_LABELS = {"qlora": "QLoRA", "lora_bf16": "LoRA on the bf16 base (Q4_1 decoded)", "qlora_qv": "QLoRA, adapters on q_proj, v_proj"}
SCORING_LABELS = {"labels": "label scoring", "generate": "generation (first-word rule)"}
#: How tables name the cheap rungs of ``coursekit.cheap`` (no gradient through the model).
CHEAP_LABELS = {"bow": "bag of words", "knn": "kNN on base states", "probe": "probe on base states"}


def paired_comparisons(report: dict) -> list[tuple[str, str, str, dict]]:
    """The paired comparisons a :func:`run` report supports, on each held-out split: QLoRA (label scoring) against
    the tuned prompt (:func:`tuned_baseline`), against LoRA on bf16, the q,v ablation and each cheap rung
    (``coursekit.cheap``; when those ran).
    Returns ``[(split, name A, name B, coursekit.paired.compare result)]``, symptoms as the groups."""
    from . import paired

    symptom = {ex["id"]: ex["symptom"] for s in cdata.HELDOUT_SPLITS for ex in cdata.load_split(s)}
    q = report["heldout"]["qlora"]["labels"]
    pairs = [("QLoRA", "the tuned prompt", report["ladder"][tuned_baseline(report["ladder"])])]
    pairs += [("QLoRA", label, report["heldout"][name]["labels"])
              for name, label in (("lora_bf16", "LoRA on bf16"), ("qlora_qv", "the q,v ablation"))
              if name in report["heldout"]]
    pairs += [("QLoRA", CHEAP_LABELS[name], rung) for name, rung in (report.get("cheap") or {}).get("rungs", {}).items()]
    return [(split, a, b, paired.compare(q[split], rb[split], symptom))
            for a, b, rb in pairs for split in cdata.HELDOUT_SPLITS]


def _pct(res: dict) -> str:
    lo, hi = res["interval"]
    return f"{100 * res['accuracy']:5.1f} % [{100 * lo:4.1f}, {100 * hi:5.1f}]"


def format_report(report: dict) -> str:
    """The run as plain-text tables: accuracy with 95 % Wilson intervals and n on both held-out splits for every
    baseline and adapter, the paired comparisons (:func:`paired_comparisons`), LoRA vs QLoRA cost, and the merge
    comparison. Rows are named as in the README's tables (``coursekit.capstone_markdown``)."""
    from . import paired

    splits = cdata.HELDOUT_SPLITS
    n = {s: len(cdata.load_split(s)) for s in splits}
    rows = [(f"untrained, {name}", *(_pct(res[s]) for s in splits)) for name, res in report["ladder"].items()]
    cheap = (report.get("cheap") or {}).get("rungs", {})
    rows += [(f"cheap: {CHEAP_LABELS[name]}", *(_pct(r[s]) for s in splits)) for name, r in cheap.items()]
    for name, res in report["heldout"].items():
        for scoring, by_split in res.items():
            rows.append((f"{RUN_LABELS.get(name, name)}, {SCORING_LABELS[scoring]}", *(_pct(by_split[s]) for s in splits)))
    head = ("model", *(f"{s} (n={n[s]})" for s in splits))
    w = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    lines = ["accuracy on the held-out splits, 95 % Wilson interval", "  ".join(h.ljust(w[i]) for i, h in enumerate(head))]
    lines += ["  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)) for r in rows]
    lines += ["", "paired comparisons on the same tickets (McNemar's exact test; 95 % interval resampling whole symptoms; "
                  "a winner only where both agree)"]
    lines += [f"  {split}: " + paired.describe(c, a, b) for split, a, b, c in paired_comparisons(report)]
    lines += ["", "cost of each run (seconds per step from the training run; peak memory of QLoRA and LoRA on bf16 from a "
                  "fresh process)",
              f"{'run':12s} {'s/step':>7s} {'peak RSS MB':>12s} {'params+buffers MB':>18s} {'saved activations MB':>21s}"
              f"  trained by"]
    for name, rec in report["runs"].items():
        mem = rec.get("memory") or {}
        peak = "-" if mem.get("peak_rss_mb") is None else f"{mem['peak_rss_mb']:.0f}"
        saved = "-" if mem.get("saved_activations_mb") is None else f"{mem['saved_activations_mb']:.0f}"
        lines.append(f"{name:12s} {rec['seconds_per_step']:7.2f} {peak:>12s} {rec['footprint_mb']:18.0f} {saved:>21s}  "
                     f"{rec['by']}{' (stored)' if rec.get('cached') else ''}")
    if cheap:
        c = report["cheap"]
        lines += ["", f"cheap rungs: one feature pass of the frozen NF4 base over every ticket ({c['features_cpu_seconds']:.0f} "
                      f"CPU s), chosen by grouped CV on training tickets; what each keeps besides the base"]
        for name, r in cheap.items():
            chosen = ", ".join(f"{k} {v}" for k, v in r["chosen"].items() if k != "cv_accuracy")
            lines.append(f"  {CHEAP_LABELS[name]:22s} chosen: {chosen} (CV {100 * r['chosen']['cv_accuracy']:.1f} %); "
                         f"search {r['cost']['search_seconds']:.1f} s, fit and predict {r['cost']['fit_predict_cpu_seconds']:.2f} "
                         f"CPU s, keeps {r['cost']['kept_mb']:.2f} MB{' + the base' if r['cost']['needs_base'] else ''}")
    m = report["merge"]
    lines += ["", f"reload on a fresh NF4 base: largest |logit difference| {m['reload_max_abs_diff']:.3g}",
              f"merged models against the trained function (NF4 + adapter, accuracy {_pct(m['reference'])}) "
              f"on {m['n']} unseen-symptom tickets; first answer token"]
    for name, r in [("untrained base, no merge", m["base"]), *m["merges"].items()]:
        c = r["paired"]
        lines.append(f"  {name:26s} max |Δlogit| {r['max_abs_diff']:6.2f}  mean {r['mean_abs_diff']:.3f}  "
                     f"same greedy label {100 * r['agreement']:5.1f} %  accuracy {_pct(r)} (n={r['n']})  "
                     f"loses {c['b_only']:3d} gains {c['a_only']:3d} (McNemar exact p = {c['p_value']:.2g})  "
                     f"no label {100 * r['no_label']:5.1f} %  same first token as the untrained base "
                     f"{100 * r['same_token_as_base']:5.1f} %")
    lines.append(f"  (the NF4 merge changed {100 * m['nf4_codes_changed']:.4f} % of the 4-bit codes; loses and gains: "
                 f"tickets right only for the trained function, and only for the merged model)")
    lines.append(f"\nwall time {report['wall_seconds']:.0f} s")
    return "\n".join(lines)
