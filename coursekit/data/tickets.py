"""The capstone data set: maintenance tickets → one issue category (a single lowercase word).

Origin: written for this course (no scraped or third-party text), after the smallest example of
supervised fine-tuning data there is, one chat turn and its answer::

    {"messages": [{"role": "user", "content": "Return the issue category for: motor overheats."},
                  {"role": "assistant", "content": "thermal"}]}

A ticket is ``template(machine, symptom)``. Symptoms carry the category (each symptom belongs to
exactly one label and names one unambiguous cue: heat, power, moving parts, oil pressure, code, link);
machines and templates are neutral. The generator is deterministic (``random.Random(seed)``).

How the held-out split is built
-------------------------------
* Templates (phrasings): ``T0``–``T7`` are used only in ``train``; ``H0``–``H3`` only in ``heldout``.
* Components (machines): ``TRAIN_MACHINES`` only in ``train``; ``HELDOUT_MACHINES`` only in
  ``heldout``.
* Symptoms are shared: they are the category knowledge being taught; the held-out split measures
  whether it transfers to new wording and new equipment.
So every held-out ticket has a phrasing *and* a machine the training split never uses; no
held-out text can equal a training text, and ``max_cross_split_jaccard`` (character 3-grams after
``normalize``) measures how close the nearest pair is (tests keep it below ``NEAR_DUP_JACCARD``).

Sizes: ``TRAIN_PER_LABEL`` × 6 = 360 training and ``HELDOUT_PER_LABEL`` × 6 = 120 held-out
examples, exactly balanced over labels and, within a label, over its 10 symptoms (6 per symptom in
train, 2 in held-out); for each symptom the (template, machine) pairs are drawn without replacement,
so there are no duplicates within a split either.

Every example is a dict::

    {"id": "train-0007", "split": "train",
     "messages": [{"role": "user", "content": PROMPT_PREFIX + ticket},
                  {"role": "assistant", "content": label}],
     "ticket": str, "label": str, "component": str, "template": "T3", "symptom": "thermal-04"}

The user turn is always built by ``prompt_messages(ticket)``; the baseline and the tuned model are
evaluated with exactly that prompt. License: Apache-2.0 (see DATASHEET.md).
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from typing import Any

__all__ = [
    "LABELS",
    "LABEL_DEFINITIONS",
    "PROMPT_PREFIX",
    "SYMPTOMS",
    "TRAIN_TEMPLATES",
    "HELDOUT_TEMPLATES",
    "TRAIN_MACHINES",
    "HELDOUT_MACHINES",
    "TRAIN_PER_LABEL",
    "HELDOUT_PER_LABEL",
    "UNSEEN_PER_LABEL",
    "UNSEEN_SYMPTOMS",
    "HELDOUT_SPLITS",
    "NEAR_DUP_JACCARD",
    "prompt_messages",
    "chat_example",
    "make_splits",
    "load_split",
    "label_counts",
    "counts_table",
    "normalize",
    "char_ngrams",
    "jaccard",
    "max_cross_split_jaccard",
]

PROMPT_PREFIX = "Return the issue category for: "

LABEL_DEFINITIONS: dict[str, str] = {
    "thermal": "abnormal heat or temperature: overheating, cooling failure, missed temperature setpoints",
    "electrical": "power supply and wiring: breakers, fuses, shorts, missing phases, voltage, shocks",
    "mechanical": "moving parts and structure: gears, bearings, belts, chains, shafts, vibration, wear",
    "hydraulic": "oil-hydraulic circuits: pressure loss, leaks, hoses, hydraulic pumps and valves",
    "software": "programs and firmware: crashes, freezes, faulty logic, bad updates, licensing",
    "network": "communication between devices: Ethernet, Wi-Fi, fieldbus, timeouts, addressing",
}
LABELS: tuple[str, ...] = tuple(LABEL_DEFINITIONS)

# Each symptom is a clause whose category is unambiguous on its own.
SYMPTOMS: dict[str, tuple[str, ...]] = {
    "thermal": (
        "the drive motor overheats",
        "the bearing housing runs hot to the touch",
        "the control cabinet temperature keeps climbing",
        "the cooling fan stopped and the unit overheats",
        "the chiller cannot hold the coolant temperature",
        "the heat exchanger outlet is far too hot",
        "the heating zone overshoots its temperature setpoint",
        "the high temperature alarm goes off after an hour of running",
        "the heating element never reaches operating temperature",
        "the exhaust air is much hotter than normal",
    ),
    "electrical": (
        "the main breaker trips on startup",
        "the supply fuse blows repeatedly",
        "the control panel has no power at all",
        "the motor cable has a short to ground",
        "the 24 V power supply output has dropped to 18 V",
        "a contactor chatters and the panel lights flicker",
        "the earth fault relay keeps tripping",
        "one phase of the three-phase supply is missing",
        "the terminal block sparks when the line starts",
        "the operator got an electric shock from the housing",
    ),
    "mechanical": (
        "the gearbox grinds when loaded",
        "the drive belt slips and squeals",
        "a bearing knocks loudly at full speed",
        "the shaft coupling is cracked",
        "the chain keeps jumping off the sprocket",
        "the frame vibrates badly at high speed",
        "a bolt on the mounting bracket has sheared off",
        "the rollers are seized and will not turn",
        "the cam follower is worn and rattles",
        "the spindle has excessive play",
    ),
    "hydraulic": (
        "the hydraulic cylinder seal leaks oil",
        "hydraulic pressure drops when the clamp closes",
        "the hydraulic pump whines and pressure stays low",
        "the hydraulic accumulator will not hold pressure",
        "a hydraulic hose burst at the fitting",
        "the hydraulic valve sticks and the ram creeps",
        "the hydraulic oil is foaming in the reservoir",
        "the hydraulic relief valve opens far below its setting",
        "the ram moves slowly because hydraulic flow is weak",
        "oil is dripping from the hydraulic manifold",
    ),
    "software": (
        "the controller firmware crashes on boot",
        "the HMI software freezes after the latest update",
        "the PLC program stops with a watchdog error",
        "the recipe software saves the wrong parameters",
        "the machine app shows a null pointer exception",
        "a software bug resets the batch counter",
        "the license check fails and the software will not start",
        "the scheduling software skips queued jobs",
        "the firmware update left the controller in a boot loop",
        "the operator screen shows a program stack trace",
    ),
    "network": (
        "the controller drops off the network",
        "the PLC loses its Ethernet link every few minutes",
        "the HMI cannot reach the server over the network",
        "the Wi-Fi scanner keeps disconnecting",
        "the fieldbus reports communication timeouts",
        "the network switch port shows heavy packet loss",
        "the remote I/O station stopped answering pings",
        "the gateway refuses the network connection",
        "an IP address conflict knocks the panel offline",
        "Modbus messages to the drive time out",
    ),
}

# Held out as a whole: symptoms whose cue never occurs in training. Each entry is (clause, cues): the
# cues are the words that carry the category, and tests/test_data.py checks that no training ticket
# contains any of them (nor a word sharing their first five letters) and that no clause names its label.
UNSEEN_SYMPTOMS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "thermal": (
        ("the thermocouple reads far above the limit", ("thermocouple",)),
        ("the oven thermostat fails and the product comes out burnt", ("oven", "thermostat", "burnt")),
        ("the glue pot is boiling over", ("glue", "boiling")),
        ("the radiator is clogged and the engine runs warm", ("radiator", "warm")),
        ("the ice machine cannot get below minus five degrees", ("ice", "degrees")),
        ("the furnace lining glows red on the outside", ("furnace", "glows")),
        ("the sterilizer scorches the pouches", ("sterilizer", "scorches")),
        ("the refrigerant charge is lost and the cold room warms up", ("refrigerant", "cold")),
    ),
    "electrical": (
        ("the insulation tester shows a low reading on the windings", ("insulation", "windings")),
        ("the RCD cuts out at random", ("rcd",)),
        ("the mains plug is charred and the socket is loose", ("mains", "plug", "socket", "charred")),
        ("the transformer hums and the output reads zero volts", ("transformer", "volts")),
        ("the UPS beeps and its battery is flat", ("ups", "battery")),
        ("an isolator arcs when it is opened", ("isolator", "arcs")),
        ("the wiring harness has a chafed conductor", ("wiring", "harness", "conductor")),
        ("the generator output sags and the lamps dim", ("generator", "lamps")),
    ),
    "mechanical": (
        ("a tooth has broken off the pinion", ("tooth", "pinion")),
        ("the pulley wobbles on its keyway", ("pulley", "keyway")),
        ("the linear rail is scored and the carriage binds", ("rail", "carriage", "binds")),
        ("the support beam is bent out of line", ("beam", "bent")),
        ("the brake pads are down to the backing plate", ("brake", "pads")),
        ("an idler wheel is flat-spotted and thumps", ("idler", "thumps")),
        ("the lead screw has backlash", ("screw", "backlash")),
        ("the universal joint is loose and clunks", ("joint", "clunks")),
    ),
    "hydraulic": (
        ("the piston rod weeps fluid at the gland", ("piston", "fluid", "gland")),
        ("the spool of the directional block is jammed", ("spool", "directional")),
        ("the sump fluid is milky with water", ("sump", "milky")),
        ("the return-line filter is clogged with sludge", ("filter", "sludge")),
        ("the jack will not lift because fluid bypasses internally", ("jack", "bypasses")),
        ("the loader boom drifts down overnight", ("boom", "drifts")),
        ("a fine jet of fluid sprays from a steel line", ("jet", "sprays")),
        ("the gauge reads 20 bar instead of 180 bar", ("gauge", "bar")),
    ),
    "software": (
        ("the database query returns duplicate rows", ("database", "query")),
        ("the interface grows sluggish until a restart because memory fills up", ("interface", "sluggish", "memory")),
        ("the script throws a syntax error after the patch", ("script", "syntax", "patch")),
        ("the spreadsheet macro rounds the totals wrongly", ("spreadsheet", "macro")),
        ("the installer rolls back with a missing DLL", ("installer", "dll")),
        ("every record gets the timestamp 1970", ("timestamp", "record")),
        ("the kernel reports a corrupted file system", ("kernel", "corrupted")),
        ("the code has an infinite loop in the sorting routine", ("code", "infinite", "routine")),
    ),
    "network": (
        ("the router drops out every few minutes", ("router",)),
        ("the DNS lookup for the historian fails", ("dns", "lookup")),
        ("the fibre between the two halls shows high attenuation", ("fibre", "attenuation")),
        ("the Profinet devices lose sync with the controller", ("profinet", "sync")),
        ("the VPN to the vendor will not come up", ("vpn", "vendor")),
        ("the tablet is out of range of the wireless access point", ("wireless", "access")),
        ("the CAN bus is flooded with bad telegrams", ("can bus", "telegrams")),
        ("the firewall blocks traffic from the new controller", ("firewall", "traffic")),
    ),
}

# {m}: machine, {s}: symptom clause. "_cap" variants capitalize the first letter.
TRAIN_TEMPLATES: dict[str, str] = {
    "T0": "{M}: {s}.",
    "T1": "On {m}, {s}.",
    "T2": "{S} on {m}.",
    "T3": "Operator reports that on {m} {s}.",
    "T4": "{M} - {s} since the last shift.",
    "T5": "Ticket: {s} ({m}).",
    "T6": "Night shift noticed that {s} at {m}.",
    "T7": "{S}; {m} is affected.",
}
HELDOUT_TEMPLATES: dict[str, str] = {
    "H0": "Maintenance request for {m}: {s}.",
    "H1": "We found this morning that {s} on {m}.",
    "H2": "{M} needs attention because {s}.",
    "H3": "Urgent, reported at {m}: {s}.",
}

TRAIN_MACHINES: tuple[str, ...] = (
    "the packaging line conveyor",
    "the bottle filler on line 2",
    "the stamping press",
    "the CNC lathe in cell 4",
    "the injection molding machine",
    "the palletizer robot",
    "the paint booth",
    "the label printer",
    "the shrink-wrap tunnel",
    "the dough divider",
    "the case packer",
    "the sorting conveyor",
    "the welding robot",
    "the carton erector",
    "the mixing tank agitator",
    "the laser cutter",
    "the overhead crane",
    "the surface grinder",
    "the extruder on line 1",
    "the cardboard baler",
)
HELDOUT_MACHINES: tuple[str, ...] = (
    "the bottle capper",
    "the die-casting cell",
    "the pick-and-place machine",
    "the tablet press",
    "the blister packaging machine",
    "the wood planer",
    "the sheet metal folder",
    "the vacuum packer",
)

TRAIN_PER_LABEL = 60
HELDOUT_PER_LABEL = 20
UNSEEN_PER_LABEL = 24
#: The two held-out splits, each testing one kind of generalisation (see the module docstring).
HELDOUT_SPLITS: tuple[str, ...] = ("unseen_phrasing", "unseen_symptom")
#: Largest character-3-gram Jaccard similarity allowed between any held-out and any training ticket.
NEAR_DUP_JACCARD = 0.7


def prompt_messages(ticket: str) -> list[dict[str, str]]:
    """The user turn for one ticket: ``[{"role": "user", "content": PROMPT_PREFIX + ticket}]``.

    Used by the data set, the zero-shot baseline and the tuned evaluation alike, so the prompt is
    identical everywhere. No system message is added here; note that SmolLM2's chat template then
    injects its default system prompt ("You are a helpful AI assistant named SmolLM, ...") — in
    training and evaluation alike.
    """
    if not isinstance(ticket, str) or not ticket.strip():
        raise ValueError(f"ticket must be a non-empty string, got {ticket!r}")
    return [{"role": "user", "content": PROMPT_PREFIX + ticket.strip()}]


def chat_example(ticket: str, label: str) -> dict[str, Any]:
    """``{"messages": prompt_messages(ticket) + [assistant turn with label]}``; label must be in LABELS."""
    if label not in LABELS:
        raise ValueError(f"unknown label {label!r}; expected one of {LABELS}")
    return {"messages": prompt_messages(ticket) + [{"role": "assistant", "content": label}]}


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _render(template: str, machine: str, symptom: str) -> str:
    return template.format(m=machine, M=_cap(machine), s=symptom, S=_cap(symptom))


def _draw(
    rng: random.Random,
    split: str,
    symptoms: dict[str, tuple[str, ...]],
    templates: dict[str, str],
    machines: tuple[str, ...],
    per_label: int,
    symptom_tag: str = "",
) -> list[dict[str, Any]]:
    out = []
    for label in LABELS:
        n_sym = len(symptoms[label])
        if per_label % n_sym:
            raise ValueError(f"{per_label} examples per label do not divide over {n_sym} symptoms")
        # stratified by symptom: every symptom appears per_label / n_sym times in its split
        combos = [(tid, m) for tid in templates for m in machines]
        for si, symptom in enumerate(symptoms[label]):
            for tid, machine in rng.sample(combos, per_label // n_sym):
                ticket = _render(templates[tid], machine, symptom)
                ex = chat_example(ticket, label)
                ex.update(
                    ticket=ticket,
                    label=label,
                    component=machine,
                    template=tid,
                    symptom=f"{label}-{symptom_tag}{si:02d}",
                )
                out.append(ex)
    rng.shuffle(out)
    for i, ex in enumerate(out):
        ex["id"] = f"{split}-{i:04d}"
        ex["split"] = split
    return out


@lru_cache(maxsize=4)
def _splits(seed: int) -> dict[str, tuple[dict[str, Any], ...]]:
    rng = random.Random(seed)
    unseen = {label: tuple(clause for clause, _ in items) for label, items in UNSEEN_SYMPTOMS.items()}
    # Drawn in this order, so that adding a split after the others leaves their examples unchanged.
    train = _draw(rng, "train", SYMPTOMS, TRAIN_TEMPLATES, TRAIN_MACHINES, TRAIN_PER_LABEL)
    phrasing = _draw(rng, "unseen_phrasing", SYMPTOMS, HELDOUT_TEMPLATES, HELDOUT_MACHINES, HELDOUT_PER_LABEL)
    symptom = _draw(rng, "unseen_symptom", unseen, HELDOUT_TEMPLATES, HELDOUT_MACHINES, UNSEEN_PER_LABEL, "u")
    return {"train": tuple(train), "unseen_phrasing": tuple(phrasing), "unseen_symptom": tuple(symptom)}


def make_splits(seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """All three splits, deterministic in ``seed``: ``{"train": [360], "unseen_phrasing": [120],
    "unseen_symptom": [144]}`` (example dicts).

    Returns fresh copies (safe to mutate). See the module docstring for what each held-out split
    keeps out of training.
    """
    import copy

    return {k: copy.deepcopy(list(v)) for k, v in _splits(seed).items()}


def load_split(split: str, seed: int = 0) -> list[dict[str, Any]]:
    """One split by name: ``"train"``, ``"unseen_phrasing"`` or ``"unseen_symptom"``.

    Raises ValueError for any other name."""
    splits = make_splits(seed)
    if split not in splits:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(splits)}")
    return splits[split]


def label_counts(examples: list[dict[str, Any]]) -> dict[str, int]:
    """Number of examples per label, in ``LABELS`` order (labels with no example count 0)."""
    counts = {label: 0 for label in LABELS}
    for ex in examples:
        counts[ex["label"]] += 1
    return counts


def counts_table(seed: int = 0) -> str:
    """The markdown table of examples per label per split that DATASHEET.md must contain verbatim."""
    splits = _splits(seed)
    counts = {name: label_counts(list(exs)) for name, exs in splits.items()}
    lines = ["| label | " + " | ".join(counts) + " |", "|---|" + "---:|" * len(counts)]
    for label in LABELS:
        lines.append(f"| {label} | " + " | ".join(str(c[label]) for c in counts.values()) + " |")
    lines.append("| **total** | " + " | ".join(str(sum(c.values())) for c in counts.values()) + " |")
    return "\n".join(lines)


def normalize(text: str) -> str:
    """Lowercase, keep letters/digits, collapse whitespace: the key for exact-duplicate checks."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def char_ngrams(text: str, n: int = 3) -> frozenset[str]:
    """Set of character n-grams of ``normalize(text)`` (the whole string if shorter than n)."""
    t = normalize(text)
    if len(t) < n:
        return frozenset([t])
    return frozenset(t[i : i + n] for i in range(len(t) - n + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b| (1.0 for two empty sets)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def max_cross_split_jaccard(seed: int = 0, n: int = 3, split: str = "unseen_phrasing") -> tuple[float, str, str]:
    """The most similar (held-out, train) ticket pair: ``(jaccard, heldout_ticket, train_ticket)``.

    split: which held-out split to compare with the training split (one of ``HELDOUT_SPLITS``)."""
    if split not in HELDOUT_SPLITS:
        raise ValueError(f"unknown held-out split {split!r}; expected one of {HELDOUT_SPLITS}")
    splits = _splits(seed)
    train = [(ex["ticket"], char_ngrams(ex["ticket"], n)) for ex in splits["train"]]
    best = (-1.0, "", "")
    for ex in splits[split]:
        g = char_ngrams(ex["ticket"], n)
        for t, tg in train:
            j = jaccard(g, tg)
            if j > best[0]:
                best = (j, ex["ticket"], t)
    return best
