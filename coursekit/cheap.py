"""The cheap alternatives to fine-tuning, on the capstone's tickets: the rungs a careful engineer tries first.

Three classifiers, none of which sends a gradient through the model:

* **bag of words**: TF-IDF of words (1- and 2-grams) and of character 2- to 5-grams within words, then a
  multinomial logistic regression (scikit-learn: ``TfidfVectorizer``, ``LogisticRegression``). No model at all.
* **kNN**: k nearest training tickets by cosine similarity of the frozen base's pooled hidden states, majority
  vote (ties to the nearest neighbour's label).
* **probe**: a multinomial logistic regression on the frozen base's pooled hidden states (standardized).

The base is the one QLoRA trains on: the NF4 base (``coursekit.model.load_model("nf4")``, computing as
``coursekit.capstone.for_this_cpu`` says). Its features come from one ``torch.no_grad()`` forward per batch with
every layer's hidden states kept (:func:`hidden_features`): ``hidden_states[0]`` is the embedding output,
``hidden_states[l]`` the output of decoder layer l. Pooling is the mean over the real tokens (padding never
pooled) or the last real token. The text fed is either the raw ticket or the chat prompt QLoRA is trained and
evaluated with (``coursekit.data.prompt_messages``, the assistant turn opened); for the chat prompt, the tokens
every prompt shares (system turn, the instruction) are computed once and cached, and pooling runs over each
prompt's own tokens (the ticket and the turn's closing tokens, whose last one predicts the answer).

Every choice (k, layer, pooling, regularisation C, the text fed) is made by cross-validation on the **training**
tickets only, grouped by symptom (``sklearn.model_selection.GroupKFold``, :data:`FOLDS` folds): each fold's
choice is scored on symptoms its fit never saw, as unseen-symptom tickets are. The held-out splits are scored
once, with the configuration the search chose (:func:`choose`). Results are ``coursekit.evaluate.summarize``
dicts, so ``coursekit.paired.compare`` pairs them with QLoRA's, ticket by ticket.

:func:`ladder` stores everything in the capstone store (``coursekit.capstone.Store``, kind ``"cheap"``) under a
key made of the code fingerprints of the functions that computed it (:func:`code_key`), the base checkpoint,
the data and the matmul dtype, so a second run (lesson 19 run again, the grader) only reads.
"""

from __future__ import annotations

import pickle
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from . import data as cdata
from . import evaluate as ceval
from .fingerprint import code_fingerprint

__all__ = ["FOLDS", "LAYERS", "POOLINGS", "FED", "KS", "CS", "BOW_CS", "RUNG_NAMES", "layer_features", "pool",
           "probe_features", "hidden_features", "grouped_cv", "choose", "bow_search", "knn_search", "probe_search", "knn_predict",
           "fit_probe", "train_probe", "fit_bow", "compute_ladder", "chosen_features", "code_key", "ladder"]

#: Folds of the grouped cross-validation (60 training symptoms: 12 held out per fold).
FOLDS = 5
#: hidden_states indices searched (0 = embeddings; the base has 30 decoder layers).
LAYERS = (0, 5, 10, 15, 20, 25, 30)
POOLINGS = ("mean", "last")
#: What the base reads: the raw ticket, or the chat prompt QLoRA is trained with.
FED = ("ticket", "prompt")
KS = (1, 5, 15)
#: Inverse regularisation strengths of the probe (on standardized features) and of the bag of words. The probe
#: stops at 0.1: C = 1 never won the grouped CV, and its weakly regularised lbfgs fits were the search's slow ones.
CS = (0.01, 0.1)
BOW_CS = (1.0, 10.0, 100.0)
RUNG_NAMES = {"bow": "bag of words (TF-IDF words + char n-grams, logistic regression)",
              "knn": "kNN on the frozen base's pooled hidden states",
              "probe": "logistic-regression probe on the frozen base's hidden states"}


# --------------------------------------------------------------------------- features of the frozen base


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Pool one layer's hidden states over each row's real tokens.

    hidden: [B, T, H] float; mask: [B, T] (1 real token, 0 padding, padding on either side). ``"mean"``: the mean
    over the real tokens; ``"last"``: the state at the row's last real token (the rightmost 1). Returns float32
    [B, H]. Raises ValueError for an unknown pooling or a row without a real token."""
    m = mask.to(hidden.dtype)
    if (m.sum(1) == 0).any():
        raise ValueError("a row has no real token (its attention mask is all 0)")
    if pooling == "mean":
        return ((hidden * m[..., None]).sum(1) / m.sum(1, keepdim=True)).float()
    if pooling == "last":
        last = mask.shape[1] - 1 - mask.flip(1).long().argmax(1)
        return hidden[torch.arange(hidden.shape[0]), last].float()
    raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")


def probe_features(hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor, layer: int) -> torch.Tensor:
    """The probe's features: decoder layer ``layer``'s output, averaged over each row's real tokens.

    hidden_states: what a causal LM returns with ``output_hidden_states=True``: L + 1 float tensors [B, T, H],
    index 0 the embedding output and index l the output of decoder layer l. attention_mask: [B, T], 1 for a real
    token and 0 for padding (on either side). layer: 0 (the embeddings) to L. Returns float32 [B, H]: row b is
    Σ_t m[b, t] h[b, t] / Σ_t m[b, t] with h = hidden_states[layer] (lesson 19's probe item; :func:`pool`)."""
    return pool(hidden_states[layer], attention_mask, "mean")


@torch.no_grad()
def layer_features(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   layer: int) -> torch.Tensor:
    """:func:`probe_features` of a frozen causal LM on one batch: float32 [B, H]. One forward without gradients
    (``torch.no_grad``: frozen and never part of a backward, so no activation is kept for one)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    return probe_features(out.hidden_states, attention_mask, layer)


def _stack(rows: list[torch.Tensor]) -> np.ndarray:
    return torch.cat(rows).numpy().astype(np.float32)


@torch.no_grad()
def hidden_features(model: torch.nn.Module, tokenizer, tickets: Sequence[str], fed: str,
                    layers: Sequence[int] = LAYERS, batch_size: int = 64,
                    progress: Callable[[int], None] | None = None) -> dict[tuple[int, str], np.ndarray]:
    """Pooled hidden states of every ticket, every layer in ``layers``, both poolings, from one pass per batch.

    fed: ``"ticket"`` (the raw text, right-padded) or ``"prompt"`` (the chat prompt with the assistant turn
    opened: the prefix all prompts share runs once and is cached, each batch runs the rest, left-padded, and
    pooling covers those tokens). Tickets are batched in order of length (less padding), results in input order.
    Returns ``{(layer, pooling): float32 [N, H]}``. Raises ValueError for an unknown ``fed`` or no tickets."""
    if fed not in FED:
        raise ValueError(f"unknown text fed {fed!r}; expected one of {FED}")
    if not tickets:
        raise ValueError("no tickets")
    from . import model as cmodel

    end = cdata.end_of_turn_id(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end
    if fed == "ticket":
        rows = [tokenizer.encode(t, add_special_tokens=False) for t in tickets]
        P, cache = 0, None
    else:
        prompts = ceval.encode_prompts(tokenizer, [cdata.prompt_messages(t) for t in tickets])
        P = ceval.common_prefix_length(prompts)
        rows = [p[P:] for p in prompts]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out: dict[tuple[int, str], list[torch.Tensor]] = {(l, p): [] for l in layers for p in POOLINGS}
    cmodel.keep_4bit_layers_trainable(model)
    was_training = model.training
    model.eval()
    try:
        if fed == "prompt":
            cache = ceval.prefill(model, prompts[0][:P])
        for i in range(0, len(order), batch_size):
            batch = [rows[j] for j in order[i:i + batch_size]]
            B, S = len(batch), max(map(len, batch))
            if fed == "ticket":  # right padding
                ids = torch.tensor([r + [pad] * (S - len(r)) for r in batch])
                mask = torch.tensor([[1] * len(r) + [0] * (S - len(r)) for r in batch])
                res = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1)
            else:  # [cached prefix, padding, own tokens]: the last column is every row's last token
                n = torch.tensor([len(r) for r in batch])
                ids = torch.tensor([[pad] * (S - len(r)) + r for r in batch])
                mask = (torch.arange(S).expand(B, S) >= (S - n)[:, None]).long()
                full = torch.cat([torch.ones(B, P, dtype=torch.long), mask], dim=1)
                pos = (P + torch.arange(S) - (S - n)[:, None]).clamp(min=P)
                res = model(input_ids=ids, attention_mask=full, position_ids=pos, cache=ceval._expand(cache, B),
                            use_cache=True, output_hidden_states=True, logits_to_keep=1)
            for layer in layers:
                for p in POOLINGS:
                    out[(layer, p)].append(pool(res.hidden_states[layer], mask, p))
            if progress:
                progress(B)
    finally:
        model.train(was_training)
    back = np.argsort(order)
    return {k: _stack(v)[back] for k, v in out.items()}


# --------------------------------------------------------------------------- the classifiers


def knn_predict(train_x: np.ndarray, train_y: Sequence[str], x: np.ndarray, k: int) -> list[str]:
    """Majority label of the ``k`` training rows most cosine-similar to each row of ``x`` (ties: the label among
    the tied ones whose nearest member is nearest). train_x [N, H], x [M, H] float; returns M labels. Raises
    ValueError for k outside 1..N."""
    if not 1 <= k <= len(train_x):
        raise ValueError(f"k must be in 1..{len(train_x)}, got {k}")
    a = train_x / np.maximum(np.linalg.norm(train_x, axis=1, keepdims=True), 1e-12)
    b = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    near = np.argsort(-(b @ a.T), axis=1, kind="stable")[:, :k]
    out = []
    for row in near:
        votes: dict[str, list[int]] = {}
        for rank, j in enumerate(row):
            votes.setdefault(train_y[j], []).append(rank)
        out.append(max(votes, key=lambda lab: (len(votes[lab]), -votes[lab][0])))
    return out


def fit_probe(x: np.ndarray, y: Sequence[str], c: float):
    """A standardized multinomial logistic regression (``StandardScaler`` then ``LogisticRegression(C=c)``, lbfgs)
    fitted on features x [N, H] and labels y."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000)).fit(x, list(y))


def train_probe(features: torch.Tensor, labels: Sequence[str], classes: Sequence[str], steps: int,
                lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A softmax probe trained by full-batch gradient descent: the gradients written out, no autograd.

    features: float [N, H] (standardize them first: one step size then suits every column); labels: N strings,
    each one of ``classes``; classes: the K labels in the order of the columns of W and b; steps: number of
    updates (0 returns the zeros it starts from); lr: the step size. With Y the one-hot rows of the labels (column
    ``classes.index(label)``), Z = XW + b and P = softmax(Z) row by row, the loss is the mean cross-entropy
    −(1/N) Σ log P[n, y_n]; its gradient with respect to Z is dZ = (P − Y) / N (the softmax-cross-entropy
    backward, lesson 05's pattern dW = Xᵀ dZ), so each step is W ← W − lr·Xᵀ dZ, b ← b − lr·Σ_n dZ[n].
    Returns (W float32 [H, K], b float32 [K]), both starting at zero. Raises ValueError for an empty batch, a
    features/labels length mismatch, a label not in ``classes``, repeated classes, non-finite features or a
    negative ``steps``. (Lesson 19's P10; :func:`fit_probe` is scikit-learn's regularized fit of the same model.)"""
    X = torch.as_tensor(features, dtype=torch.float32)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"features must be [N, H] with N >= 1, got shape {tuple(X.shape)}")
    if len(labels) != X.shape[0]:
        raise ValueError(f"{X.shape[0]} feature rows but {len(labels)} labels")
    classes = list(classes)
    if len(set(classes)) != len(classes):
        raise ValueError(f"classes repeat a label: {classes}")
    unknown = sorted({lab for lab in labels if lab not in classes})
    if unknown:
        raise ValueError(f"labels not in classes: {unknown}")
    if not torch.isfinite(X).all():
        raise ValueError("features hold NaN or infinity")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    Y = torch.nn.functional.one_hot(torch.tensor([classes.index(lab) for lab in labels]), len(classes)).float()
    W, b = torch.zeros(X.shape[1], len(classes)), torch.zeros(len(classes))
    for _ in range(steps):
        dZ = (torch.softmax(X @ W + b, dim=1) - Y) / X.shape[0]
        W -= lr * (X.T @ dZ)
        b -= lr * dZ.sum(0)
    return W, b


def fit_bow(texts: Sequence[str], y: Sequence[str], c: float):
    """TF-IDF of words (1-2 grams) and of character 2-5 grams within word boundaries (sublinear tf), then
    ``LogisticRegression(C=c)``, fitted on the raw tickets."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline, make_union

    features = make_union(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
                          TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True))
    return make_pipeline(features, LogisticRegression(C=c, max_iter=2000)).fit(list(texts), list(y))


def grouped_cv(fit_predict: Callable[[np.ndarray, np.ndarray], list[str]], y: Sequence[str],
               groups: Sequence[str], folds: int = FOLDS) -> float:
    """Accuracy (a fraction) of ``fit_predict(train_rows, test_rows)`` (row indices into the training set) over
    ``folds`` grouped folds (``GroupKFold``: each group, a symptom, is in exactly one test fold, so a fold's
    test symptoms are never in its fit). Raises ValueError for fewer groups than folds."""
    from sklearn.model_selection import GroupKFold

    y = np.asarray(y)
    if len(set(groups)) < folds:
        raise ValueError(f"need at least {folds} groups, got {len(set(groups))}")
    right = 0
    for tr, te in GroupKFold(n_splits=folds).split(np.zeros(len(y)), y, groups):
        right += sum(p == t for p, t in zip(fit_predict(tr, te), y[te]))
    return right / len(y)


def _train_only(examples: Sequence[dict]) -> None:
    bad = [ex["id"] for ex in examples if ex.get("split") != "train"]
    if bad:
        raise ValueError(f"the search runs on training tickets only; got {len(bad)} others, e.g. {bad[0]!r}")


def bow_search(train: Sequence[dict], cs: Sequence[float] = BOW_CS, folds: int = FOLDS) -> list[dict]:
    """Grouped CV of the bag of words for each C on the training tickets: ``[{"C", "cv_accuracy"}]``."""
    _train_only(train)
    texts = np.array([ex["ticket"] for ex in train], dtype=object)
    y, g = [ex["label"] for ex in train], [ex["symptom"] for ex in train]
    return [{"C": c, "cv_accuracy": grouped_cv(
        lambda tr, te, c=c: list(fit_bow(texts[tr], np.asarray(y)[tr], c).predict(list(texts[te]))), y, g, folds)}
        for c in cs]


def knn_search(train: Sequence[dict], feats: dict[tuple[str, int, str], np.ndarray], ks: Sequence[int] = KS,
               folds: int = FOLDS) -> list[dict]:
    """Grouped CV of kNN for every (text fed, layer, pooling) in ``feats`` (training rows only, in ``train``'s
    order) and every k: ``[{"fed", "layer", "pooling", "k", "cv_accuracy"}]``."""
    _train_only(train)
    y, g = np.asarray([ex["label"] for ex in train]), [ex["symptom"] for ex in train]
    return [{"fed": fed, "layer": layer, "pooling": p, "k": k, "cv_accuracy": grouped_cv(
        lambda tr, te, x=x, k=k: knn_predict(x[tr], list(y[tr]), x[te], k), y, g, folds)}
        for (fed, layer, p), x in feats.items() for k in ks]


def probe_search(train: Sequence[dict], feats: dict[tuple[str, int, str], np.ndarray], cs: Sequence[float] = CS,
                 folds: int = FOLDS) -> list[dict]:
    """Grouped CV of the probe for every (text fed, layer, pooling) in ``feats`` and every C:
    ``[{"fed", "layer", "pooling", "C", "cv_accuracy"}]``."""
    _train_only(train)
    y, g = np.asarray([ex["label"] for ex in train]), [ex["symptom"] for ex in train]
    return [{"fed": fed, "layer": layer, "pooling": p, "C": c, "cv_accuracy": grouped_cv(
        lambda tr, te, x=x, c=c: list(fit_probe(x[tr], y[tr], c).predict(x[te])), y, g, folds)}
        for (fed, layer, p), x in feats.items() for c in cs]


def choose(search: Sequence[dict]) -> dict:
    """The row of a search with the highest CV accuracy; ties go to the first in the search's order (so the
    simplest: smaller C, smaller k, earlier layer, as the grids are listed). Raises ValueError for no rows."""
    if not search:
        raise ValueError("an empty search")
    return max(search, key=lambda r: (r["cv_accuracy"], -search.index(r)))


# --------------------------------------------------------------------------- the whole ladder


def _mb(obj: Any) -> float:
    return len(pickle.dumps(obj)) / 1e6


def compute_ladder(base: torch.nn.Module, tokenizer, splits: dict[str, list[dict]], progress: bool = True,
                   layers: Sequence[int] = LAYERS) -> dict:
    """Search, fit and score the three rungs. ``splits``: ``{"train": [...], held-out split: [...]}`` as
    ``coursekit.data.load_split`` gives them; ``layers``: the hidden_states indices searched. The held-out
    tickets pass through the base in the same feature pass (their features are never seen by a search) and are
    scored once, with the chosen configuration. Returns ``{"rungs": {"bow"|"knn"|"probe": {"name", "search",
    "chosen", split: result, "cost"}}, "features_seconds", "features_cpu_seconds", "n_train", "probe_features"}``
    (``probe_features``: the probe's chosen features of every split, as ``coursekit.protocol`` encodes float32
    arrays; :func:`chosen_features` decodes them); cost: ``search_seconds``, ``fit_predict_cpu_seconds``
    (the chosen one's fit and held-out predictions), ``kept_mb`` (what a deployment keeps besides the base:
    the pickled fitted classifier, plus the training features for kNN) and ``needs_base`` (whether the base
    must run at prediction time)."""
    from tqdm.auto import tqdm

    train, heldout = splits["train"], [s for s in splits if s != "train"]
    tickets = [ex["ticket"] for s in splits for ex in splits[s]]
    bounds, at = {}, 0
    for s in splits:
        bounds[s] = slice(at, at + len(splits[s]))
        at += len(splits[s])
    t0, c0 = time.perf_counter(), time.process_time()
    feats: dict[tuple[str, int, str], np.ndarray] = {}
    bar = tqdm(total=len(FED) * len(tickets), desc="frozen base: hidden states", unit="ticket", disable=not progress,
               leave=False)
    try:
        for fed in FED:
            for (layer, p), x in hidden_features(base, tokenizer, tickets, fed, layers, progress=bar.update).items():
                feats[(fed, layer, p)] = x
    finally:
        bar.close()
    features_seconds, features_cpu = time.perf_counter() - t0, time.process_time() - c0
    train_feats = {k: v[bounds["train"]] for k, v in feats.items()}
    y = [ex["label"] for ex in train]
    rungs: dict[str, dict] = {}

    def score(name: str, search: list[dict], t_search: float, fit: Callable, predict: Callable, kept: Callable,
              needs_base: bool) -> None:
        chosen = choose(search)
        c1 = time.process_time()
        model = fit(chosen)
        out = {s: ceval.summarize([ex["label"] for ex in splits[s]], predict(model, chosen, s),
                                  [ex["id"] for ex in splits[s]]) for s in heldout}
        rungs[name] = {"name": RUNG_NAMES[name], "search": search, "chosen": chosen, **out,
                       "cost": {"search_seconds": t_search, "fit_predict_cpu_seconds": time.process_time() - c1,
                                "kept_mb": kept(model, chosen), "needs_base": needs_base}}

    t = time.perf_counter()
    s_bow = bow_search(train)
    score("bow", s_bow, time.perf_counter() - t, lambda ch: fit_bow([ex["ticket"] for ex in train], y, ch["C"]),
          lambda m, ch, s: list(m.predict([ex["ticket"] for ex in splits[s]])), lambda m, ch: _mb(m), False)
    t = time.perf_counter()
    s_knn = knn_search(train, train_feats)
    score("knn", s_knn, time.perf_counter() - t, lambda ch: train_feats[(ch["fed"], ch["layer"], ch["pooling"])],
          lambda m, ch, s: knn_predict(m, y, feats[(ch["fed"], ch["layer"], ch["pooling"])][bounds[s]], ch["k"]),
          lambda m, ch: (m.nbytes + len(pickle.dumps(y))) / 1e6, True)
    t = time.perf_counter()
    s_probe = probe_search(train, train_feats)
    score("probe", s_probe, time.perf_counter() - t,
          lambda ch: fit_probe(train_feats[(ch["fed"], ch["layer"], ch["pooling"])], y, ch["C"]),
          lambda m, ch, s: list(m.predict(feats[(ch["fed"], ch["layer"], ch["pooling"])][bounds[s]])),
          lambda m, ch: _mb(m), True)
    from . import protocol

    ch = rungs["probe"]["chosen"]
    x = feats[(ch["fed"], ch["layer"], ch["pooling"])]
    return {"rungs": rungs, "features_seconds": features_seconds, "features_cpu_seconds": features_cpu,
            "n_train": len(train),
            "probe_features": {s: protocol.encode(np.ascontiguousarray(x[bounds[s]])) for s in splits}}


def chosen_features(result: dict) -> dict[str, np.ndarray]:
    """The features the probe chose (its text fed, layer and pooling), of every split, from a :func:`ladder` result:
    ``{split: float32 [N, H]}``, rows in ``coursekit.data.load_split``'s order. Raises KeyError for a result
    without them."""
    from . import protocol

    return {s: protocol.decode(v) for s, v in result["probe_features"].items()}


def code_key() -> dict[str, str]:
    """``{function name: code_fingerprint}`` of the functions whose code decides the ladder's results (their
    helpers in this module count with them, ``coursekit.fingerprint``), plus the grids searched."""
    fns = (compute_ladder, hidden_features, bow_search, knn_search, probe_search, choose)
    return {**{f.__name__: code_fingerprint(f) for f in fns},
            "grid": repr((FOLDS, LAYERS, POOLINGS, FED, KS, CS, BOW_CS))}


def ladder(tokenizer, store, base: torch.nn.Module | None = None, progress: bool = True) -> dict:
    """The three cheap rungs on both held-out splits, from ``store`` (``coursekit.capstone.Store``, kind
    ``"cheap"``) or computed and stored. ``base``: the NF4 base, loaded here only if the result is missing. The
    result of :func:`compute_ladder`, plus ``seconds`` (the computation's wall time when it ran), ``base_mb``
    (the NF4 base's parameters and buffers: what a deployment of kNN or the probe keeps as well) and ``cached``.
    Raises ``coursekit.capstone.CacheMiss`` inside grading when it was never computed on this machine."""
    from . import capstone
    from . import model as cmodel
    from . import train as ctrain

    key = {"base": ctrain.base_identity()["checkpoint_files"], "data": capstone.data_key(),
           "matmul": capstone._matmul(), "code": code_key()}

    def compute() -> dict:
        import warnings

        model = base if base is not None else capstone.for_this_cpu(cmodel.load_model("nf4"))
        splits = {s: cdata.load_split(s) for s in ("train",) + tuple(cdata.HELDOUT_SPLITS)}
        with warnings.catch_warnings():  # a notebook writes nothing to stderr: scikit-learn's convergence notes
            warnings.simplefilter("ignore")  # (an lbfgs that stops at max_iter) are no part of the lesson
            out = compute_ladder(model, tokenizer, splits, progress)
        return {**out, "base_mb": cmodel.footprint(model) / 1e6}

    return store.result("cheap", key, compute, "coursekit.cheap")
