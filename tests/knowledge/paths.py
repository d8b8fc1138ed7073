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
