"""Random full paths through a knowledge pack, for tests that render many kernels."""

import random


def random_paths(pack, n: int, seed: int) -> list[tuple[dict, dict]]:
    """``n`` (choices, knobs) pairs drawn with a seeded RNG: a family, then one choice for every decision of
    that family and one value for every knob of the chosen choices."""
    rng, out = random.Random(seed), []
    for _ in range(n):
        fam = rng.choice(pack.families).id
        choices, knobs = {"family": fam}, {}
        for dec in pack.decisions_for(fam):
            ch = rng.choice(dec.choices)
            choices[dec.id] = ch.id
            knobs.update({k: rng.choice(knob.values) for k, knob in ch.knobs.items()})
        out.append((choices, knobs))
    return out


def single_moves(pack) -> list[tuple[dict, dict]]:
    """Each family's default path, and each family with one other choice or one other knob value taken: every
    move the patterns proposer makes from a family's root."""
    out = []
    for fam in pack.families:
        out.append(({"family": fam.id}, {}))
        resolved = pack.resolve({"family": fam.id}, {})
        for dec in pack.decisions_for(fam.id):
            for ch in dec.choices:
                if ch.id != resolved.choices[dec.id] and ch.applies_to(fam.id):
                    out.append(({"family": fam.id, dec.id: ch.id}, {}))
            for kname, knob in dec.choice(resolved.choices[dec.id]).knobs.items():
                out += [({"family": fam.id}, {kname: v}) for v in knob.values if v != knob.default]
    return out


def path_id(path) -> str:
    """A pytest id for a (choices, knobs) pair: the choice ids, then ``|knob=value,...``."""
    choices, knobs = path
    return ",".join(str(v) for v in choices.values()) + ("|" + ",".join(f"{k}={v}" for k, v in knobs.items())
                                                         if knobs else "")
