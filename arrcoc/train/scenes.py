"""Procedural captioned scenes: shapes, colours, sizes, positions, textures and text-like marks
on varied backgrounds, each with a caption that names exactly one object and a mask per object.

Everything is drawn with Pillow from one numpy Generator, so a seed gives the same scenes on
every machine. Captions come from templates with synonyms; the evaluation split uses templates
and synonyms that training never sees ("held-out phrasings") on scenes drawn from another seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

# name -> RGB. Backgrounds are desaturated, so every one of these stands out from them.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (214, 32, 32),
    "green": (34, 160, 52),
    "blue": (36, 72, 214),
    "yellow": (240, 214, 30),
    "orange": (244, 128, 20),
    "purple": (128, 40, 170),
    "white": (248, 248, 248),
    "black": (14, 14, 14),
}
# No hexagon: at 16-px cells a hexagon and a circle of these sizes pool to the same texture.
SHAPES = ("circle", "square", "triangle", "star", "diamond", "cross")
TEXT = "text"  # the kind of a text-like mark (rows of glyph strokes)
SIZES = {"small": (30.0, 40.0), "medium": (48.0, 62.0), "large": (74.0, 96.0)}  # radius, px at 512
ROWS = ("top", "middle", "bottom")
COLS = ("left", "centre", "right")

# Synonyms: training draws from the first list, evaluation also from the second (held out).
SHAPE_WORDS = {  # "<noun> shape" appears in training for triangle and star, held out for the others
    "circle": (["circle", "disc", "dot", "round one"], ["round shape", "circular shape"]),
    "square": (["square", "box", "block"], ["square shape"]),
    "triangle": (["triangle", "triangle shape"], ["triangular shape"]),
    "hexagon": (["hexagon"], ["hexagonal shape"]),  # kept for callers; not drawn (see SHAPES)
    "star": (["star", "five-pointed star", "star shape"], ["star-shaped one"]),
    "diamond": (["diamond", "rhombus"], ["diamond shape"]),
    "cross": (["cross", "plus sign"], ["plus", "cross shape"]),
    TEXT: (["text", "writing", "words", "printed text", "caption"], ["label", "lettering"]),
}
SIZE_WORDS = {
    "small": (["small", "little"], ["tiny"]),
    "large": (["large", "big"], ["huge"]),
    "medium": (["medium"], ["medium-sized"]),
}
POSITION_WORDS = {  # (row, col) -> phrase after "in the" / "at the"
    ("top", "left"): "top left",
    ("top", "centre"): "top",
    ("top", "right"): "top right",
    ("middle", "left"): "left",
    ("middle", "centre"): "centre",
    ("middle", "right"): "right",
    ("bottom", "left"): "bottom left",
    ("bottom", "centre"): "bottom",
    ("bottom", "right"): "bottom right",
}
RELATIONS = {
    "left of": (["left of", "to the left of"], ["on the left side of"]),
    "right of": (["right of", "to the right of"], ["on the right side of"]),
    "above": (["above"], ["over"]),
    "below": (["below", "under"], ["beneath"]),
}

# Caption frames: {d} is the description ("the small red circle ..."). Held-out frames only at eval.
TRAIN_FRAMES = (
    "{d}",
    "{d}",
    "{d}",
    "find {d}",
    "where is {d}",
    "look at {d}",
    "show me {d}",
    "select {d}",
    "spot {d}",
    "focus on {d}",
    "{d} in the picture",
    "is there {d}?",
    "mark {d}",
    "where's {d}?",
    "give me {d}",
    "the part of the image with {d}",
)
HELDOUT_FRAMES = ("point to {d}", "{d}, please", "can you locate {d}?", "highlight {d}", "I want {d}")
# Extended training vocabulary (`SceneConfig.extra_phrasings`): more frames, synonyms and word
# orders for paraphrase robustness. Training only, and none of it is a held-out phrasing (tested):
# the held-out frames and synonyms above stay unseen.
EXTRA_FRAMES = (
    "please find {d}",
    "can you find {d}?",
    "find me {d}",
    "where can I see {d}?",
    "where exactly is {d}?",
    "show {d}",
    "pick {d}",
    "tap on {d}",
    "indicate {d}",
    "identify {d}",
    "I'm looking for {d}",
    "look for {d}",
    "search for {d}",
    "{d}?",
    "{d}.",
    "show me where {d} is",
    "could you show me {d}?",
    "help me find {d}",
    "I need {d}",
    "now find {d}",
    "which one is {d}?",
    "zoom in on {d}",
    "attend to {d}",
    "get {d}",
    "go to {d}",
    "check out {d}",
    "there is {d} somewhere, find it",
    "in this image, find {d}",
    "{d} — where is it?",
    "find {d} for me",
)
EXTRA_SHAPE_WORDS = {
    "circle": ["ball", "round object", "circle shape", "round blob", "circle figure", "orb"],
    "square": ["rectangle", "cube", "square tile", "four-sided figure", "quadrilateral", "square figure"],
    "triangle": ["pyramid", "wedge", "three-sided figure", "triangle figure", "triangle icon"],
    "hexagon": ["six-sided figure"],
    "star": ["starburst", "star figure", "star icon", "pointy star", "star symbol"],
    "diamond": ["lozenge", "diamond figure", "rhombus shape", "diamond icon", "tilted square"],
    "cross": ["plus symbol", "cross figure", "cross symbol", "plus mark"],
    TEXT: ["script", "characters", "text block", "paragraph", "written words", "inscription", "typed text"],
}
EXTRA_SIZE_WORDS = {
    "small": ["smaller", "mini", "petite", "small-sized"],
    "large": ["larger", "giant", "bigger", "massive", "enormous", "large-sized"],
    "medium": ["mid-sized"],
}
EXTRA_RELATIONS = {
    "left of": ["just left of", "located left of", "at the left of", "leftward of"],
    "right of": ["just right of", "located right of", "at the right of", "rightward of"],
    "above": ["higher than", "up from", "further up than", "on top of"],
    "below": ["lower than", "down from", "further down than"],
}
EXTRA_POSITION_WORDS = {  # alternatives to POSITION_WORDS' phrase, with their own preposition
    ("top", "left"): ["in the upper left", "in the top-left corner", "at the upper left"],
    ("top", "centre"): ["at the top middle", "near the top", "up top"],
    ("top", "right"): ["in the upper right", "in the top-right corner", "at the upper right"],
    ("middle", "left"): ["at the left", "on the left-hand side", "at the left edge"],
    ("middle", "centre"): ["in the middle", "in the center", "at the centre"],
    ("middle", "right"): ["at the right", "on the right-hand side", "at the right edge"],
    ("bottom", "left"): ["in the lower left", "in the bottom-left corner", "at the lower left"],
    ("bottom", "centre"): ["at the bottom middle", "near the bottom", "down at the bottom"],
    ("bottom", "right"): ["in the lower right", "in the bottom-right corner", "at the lower right"],
}
EXTRA_NOUNS = ["item", "figure", "piece", "mark"]  # "the red item", "the red figure", ...
EXTRA_SUPERLATIVES = {
    "largest": [
        "the biggest object",
        "the largest item",
        "the largest figure",
        "the most massive shape",
        "the shape that is largest",
        "the biggest item",
    ],
    "smallest": [
        "the smallest item",
        "the smallest figure",
        "the littlest object",
        "the shape that is smallest",
        "the most petite shape",
    ],
}
CAPTION_KINDS = ("colour_shape", "shape", "colour", "size", "position", "superlative", "relation", "text")

# Captions for the other two ways of knowing (`SceneConfig.knowing`). Their targets are not an
# object's mask but cells of the scorer maps (data.py): "detail" asks for the information map's top
# cells, "salience" for the perspectival map's, "plain" for the cells lowest in both (only the
# participatory scorer can point there: the balancer cannot invert a map), and "edges" mixes two
# ways: the boundary cells of one named object (participatory finds the object, perspectival its
# edges). (training phrasings, held-out phrasings); the held-out ones are for evaluation only.
KNOWING_KINDS = ("detail", "salience", "plain", "edges")
KNOWING_WORDS = {
    "detail": (
        [
            "the most detailed part",
            "the most detailed area",
            "the busiest region",
            "the area with the most detail",
            "the most intricate part",
            "the most complex region",
            "where the fine detail is",
            "the busiest part of the image",
            "the most textured area",
            "the region with the finest detail",
        ],
        ["the most elaborate region", "the part with the richest detail", "the most cluttered spot"],
    ),
    "salience": (
        [
            "what stands out",
            "the most striking part",
            "the most eye-catching area",
            "the most salient region",
            "the strongest contrast",
            "what catches the eye",
            "the most prominent edges",
            "the sharpest edges",
            "the most noticeable part",
            "the highest-contrast area",
        ],
        ["whatever pops out", "the most conspicuous region", "what draws attention"],
    ),
    "plain": (
        [
            "the plain area",
            "the empty background",
            "the flattest region",
            "a blank spot",
            "the smoothest part",
            "the most uniform area",
            "somewhere featureless",
            "an empty patch",
            "the quietest region",
            "the least detailed part",
        ],
        ["a bare spot", "the dullest area", "the calmest region"],
    ),
    "edges": (
        [
            "the edges of {d}",
            "the outline of {d}",
            "the border of {d}",
            "the contour of {d}",
            "the edge of {d}",
            "the outer edge of {d}",
        ],
        ["the rim of {d}", "the boundary of {d}", "the perimeter of {d}"],
    ),
}
KNOWING_OBJECT = -1  # the object index of a caption whose target comes from the scorer maps

# Large areas of one colour (`SceneConfig.colour_regions`): the whole background or one side of a
# straight edge, in a colour no object of the scene has, captioned by that colour ("the blue one").
# Photos have such areas (a dusk sky, a wall); desaturated backgrounds alone teach the model that a
# colour word always means a small object. Their captions have their own kind: not an object caption.
REGION = "region"
REGION_NOUNS = {
    "background": ["background", "one", "area", "part"],
    "side": ["area", "region", "part", "one", "side", "half"],
}
REGION_COVER = (0.3, 0.7)  # share of the image that a one-sided region takes (before objects cover some)
# brightness range of a region's colour: a dark blue or green is still blue or green, a dark yellow
# or orange is brown, a dark white is grey
REGION_SHADE = {"yellow": (0.8, 1.0), "orange": (0.75, 1.0), "white": (0.85, 1.0), "black": (1.0, 1.0)}


@dataclass(frozen=True)
class SceneConfig:
    size: int = 512  # pixels; the model's S
    min_shapes: int = 2
    max_shapes: int = 5
    text_prob: float = 0.45  # chance of one text-like mark in a scene
    captions_per_scene: int = 3
    heldout_phrasing: bool = False  # evaluation: held-out frames and synonyms
    # training only: extra captions per captioned object, re-phrased with the extended vocabulary
    # (EXTRA_*) by an independent generator, so the scenes and their first captions are unchanged
    extra_phrasings: int = 0
    # captions per scene for the other ways of knowing (KNOWING_KINDS), from another independent
    # generator: the scenes and their object captions do not change either
    knowing: int = 0
    # share of scenes with a large area of one colour (REGION), captioned by its colour, from another
    # independent generator: the scenes' objects, layout and their captions do not change
    colour_regions: float = 0.0


@dataclass
class SceneObject:
    kind: str  # a SHAPES name, TEXT or REGION
    colour: str
    size: str
    cx: float
    cy: float
    radius: float
    region: tuple[str, str] = ("middle", "centre")  # (row, col) of the 3x3 region of the centre
    area: int = 0  # pixels in the mask


@dataclass
class Scene:
    image: np.ndarray  # (S, S, 3) uint8
    masks: np.ndarray  # (n_objects, S, S) bool
    objects: list[SceneObject]
    # (text, object index, kind); the index is KNOWING_OBJECT for detail, salience and plain
    captions: list[tuple[str, int, str]] = field(default_factory=list)


# ----------------------------------------------------------------------------- drawing


def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    if kind == "square":
        pts = [
            (math.cos(a), math.sin(a))
            for a in np.linspace(math.pi / 4, 2 * math.pi + math.pi / 4, 4, endpoint=False)
        ]
        pts = [(x * 1.0, y * 1.0) for x, y in pts]
    elif kind == "triangle":
        pts = [
            (math.cos(a), math.sin(a)) for a in np.linspace(-math.pi / 2, 1.5 * math.pi, 3, endpoint=False)
        ]
    elif kind == "diamond":
        pts = [(0.0, -1.0), (0.7, 0.0), (0.0, 1.0), (-0.7, 0.0)]
    elif kind == "hexagon":
        pts = [(math.cos(a), math.sin(a)) for a in np.linspace(0, 2 * math.pi, 6, endpoint=False)]
    elif kind == "star":
        pts = []
        for i in range(10):
            a = -math.pi / 2 + i * math.pi / 5
            rr = 1.0 if i % 2 == 0 else 0.45
            pts.append((rr * math.cos(a), rr * math.sin(a)))
    elif kind == "cross":
        t = 0.34
        pts = [
            (-t, -1),
            (t, -1),
            (t, -t),
            (1, -t),
            (1, t),
            (t, t),
            (t, 1),
            (-t, 1),
            (-t, t),
            (-1, t),
            (-1, -t),
            (-t, -t),
        ]
    else:
        raise ValueError(kind)
    ca, sa = math.cos(angle), math.sin(angle)
    return [(cx + r * (x * ca - y * sa), cy + r * (x * sa + y * ca)) for x, y in pts]


def _background(rng: np.random.Generator, s: int) -> np.ndarray:
    """Desaturated backgrounds: flat, gradient, noise, stripes or checker (float (S, S, 3))."""
    base = rng.uniform(70, 200) + rng.uniform(-18, 18, size=3)
    style = rng.integers(5)
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) / s
    if style == 0:
        field_ = np.zeros((s, s), np.float32)
    elif style == 1:
        a = rng.uniform(0, 2 * math.pi)
        field_ = (np.cos(a) * xx + np.sin(a) * yy - 0.5) * rng.uniform(40, 90)
    elif style == 2:
        coarse = rng.normal(0, 1, size=(s // 32, s // 32)).astype(np.float32)
        field_ = np.asarray(Image.fromarray(coarse).resize((s, s), Image.Resampling.BICUBIC)) * 18
        field_ = field_ + rng.normal(0, 6, size=(s, s)).astype(np.float32)
    elif style == 3:
        period = rng.uniform(12, 48)
        a = rng.uniform(0, math.pi)
        field_ = np.sign(np.sin((np.cos(a) * xx + np.sin(a) * yy) * s * 2 * math.pi / period)) * rng.uniform(
            8, 22
        )
    else:
        period = int(rng.integers(24, 80))
        iy, ix = np.mgrid[0:s, 0:s]
        field_ = (((iy // period) + (ix // period)) % 2 * 2 - 1).astype(np.float32) * rng.uniform(8, 20)
    return np.clip(base[None, None, :] + field_[..., None], 0, 255)


def _fill(rng: np.random.Generator, rgb: tuple[int, int, int], h: int, w: int) -> np.ndarray:
    """An object's fill over its box: solid, striped or speckled shades of its colour (h, w, 3)."""
    colour = np.clip(np.array(rgb, np.float32) + rng.uniform(-14, 14, size=3), 0, 255)
    style = rng.integers(4)
    fill = np.broadcast_to(colour, (h, w, 3)).copy()
    if style == 1:  # stripes: a darker band of the same hue
        period = rng.uniform(8, 20)
        iy, ix = np.mgrid[0:h, 0:w].astype(np.float32)
        band = (np.sin((ix + iy * rng.uniform(-1, 1)) * 2 * math.pi / period) > 0)[..., None]
        fill = np.where(band, fill * 0.78, fill)
    elif style == 2:  # speckle
        fill = fill + rng.normal(0, 10, size=(h, w, 1))
    return np.clip(fill, 0, 255)


def _draw_text(draw: ImageDraw.ImageDraw, rng: np.random.Generator, cx: float, cy: float, r: float) -> None:
    """Rows of glyph-like strokes inside a box of half-width r: 'text' without a font."""
    half_h = r * rng.uniform(0.35, 0.6)
    rows = int(rng.integers(2, 4))
    line_h = 2 * half_h / rows
    for i in range(rows):
        y0 = cy - half_h + i * line_h + line_h * 0.2
        y1 = y0 + line_h * 0.6
        x = cx - r
        while x < cx + r - 4:
            w = rng.uniform(4, 10)
            draw.rectangle([x, y0 + rng.uniform(0, 2), min(x + w, cx + r), y1], fill=255)
            x += w + rng.uniform(2, 5) + (rng.uniform(5, 9) if rng.random() < 0.2 else 0)


def _colour_region(
    rng: np.random.Generator, objs: list[SceneObject], s: int
) -> tuple[str, str, np.ndarray, np.ndarray] | None:
    """A large area in a colour no object has: (colour, style, mask (S, S) bool, fill (S, S, 3) float),
    or None when the objects take every colour. The fill is shaded by a gradient, like a sky."""
    free = [c for c in COLOURS if all(o.colour != c for o in objs)]
    if not free:
        return None
    colour = free[rng.integers(len(free))]
    style = ("background", "side")[rng.integers(2)]
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) / s
    if style == "background":
        mask = np.ones((s, s), dtype=bool)
    else:  # one side of a slightly wavy straight edge
        a = rng.uniform(0, 2 * math.pi)
        along = np.cos(a) * xx + np.sin(a) * yy
        across = np.cos(a) * yy - np.sin(a) * xx
        edge = along + 0.02 * np.sin(across * rng.uniform(4, 14) + rng.uniform(0, 6.3))
        mask = edge <= np.quantile(edge, rng.uniform(*REGION_COVER))
    lo, hi = REGION_SHADE.get(colour, (0.4, 1.0))
    rgb = np.array(COLOURS[colour], np.float32) * rng.uniform(lo, hi)
    rgb = rgb + (rgb.mean() - rgb) * rng.uniform(0, 0.25)  # a little desaturated, as photos are
    a = rng.uniform(0, 2 * math.pi)
    shade = (np.cos(a) * xx + np.sin(a) * yy - 0.5) * rng.uniform(0, 40)
    return colour, style, mask, np.clip(rgb + shade[..., None], 0, 255)


def _region(cx: float, cy: float, s: int) -> tuple[str, str]:
    return ROWS[min(int(cy / s * 3), 2)], COLS[min(int(cx / s * 3), 2)]


# ----------------------------------------------------------------------------- layout


def _place(
    rng: np.random.Generator, objs: list[SceneObject], r: float, s: int, want=None
) -> tuple[float, float] | None:
    """A centre for a new object of radius r that overlaps no other (None if none found)."""
    for _ in range(200):
        cx, cy = rng.uniform(r + 4, s - r - 4, size=2)
        if want is not None and not want(cx, cy):
            continue
        if all(math.hypot(cx - o.cx, cy - o.cy) > r + o.radius + 10 for o in objs):
            return float(cx), float(cy)
    return None


def _new_object(rng, objs, s, kind=None, colour=None, size=None, want=None) -> SceneObject | None:
    kind = kind or SHAPES[rng.integers(len(SHAPES))]
    colour = colour or list(COLOURS)[rng.integers(len(COLOURS))]
    size = size or ("small", "medium", "large")[rng.integers(3)]
    lo, hi = SIZES[size]
    r = float(rng.uniform(lo, hi))
    if kind == TEXT:
        r = max(r, 44.0)
    pos = _place(rng, objs, r, s, want)
    if pos is None:
        return None
    return SceneObject(kind, colour, size, pos[0], pos[1], r, _region(pos[0], pos[1], s))


# ----------------------------------------------------------------------------- captions


_EXTRA_TABLES = {
    id(SHAPE_WORDS): EXTRA_SHAPE_WORDS,
    id(SIZE_WORDS): EXTRA_SIZE_WORDS,
    id(RELATIONS): EXTRA_RELATIONS,
}


class _Words:
    def __init__(self, rng: np.random.Generator, heldout: bool, extended: bool = False):
        self.rng, self.heldout = rng, heldout
        self.extended = extended and not heldout  # the extended vocabulary is for training only

    def pick(self, table: dict, key: str) -> str:
        train, held = table[key]
        pool = train + held if self.heldout else train
        if self.extended:
            pool = train + _EXTRA_TABLES[id(table)].get(key, [])
        # held-out runs use a held-out word half the time, so eval really tests new phrasings
        if self.heldout and held and self.rng.random() < 0.5:
            pool = held
        return pool[self.rng.integers(len(pool))]

    def frame(self, d: str) -> str:
        frames = HELDOUT_FRAMES if self.heldout else TRAIN_FRAMES
        if self.extended:
            frames = TRAIN_FRAMES + EXTRA_FRAMES
            superlative = d.split(" ")[1].endswith("est") or d.startswith(("the most ", "the shape that"))
            if not superlative and self.rng.random() < 0.3:  # article variety: "a red circle", "red circle"
                d = (
                    ("a " + d[4:])
                    if d.startswith("the ") and self.rng.random() < 0.5
                    else d.removeprefix("the ")
                )
        return frames[self.rng.integers(len(frames))].format(d=d)

    def choose(self, options: list[str]) -> str:
        return options[self.rng.integers(len(options))]

    def look(self, colour: str, o: SceneObject) -> str:
        """'red circle'; extended: also 'circle that is red', 'red-coloured circle', 'circle in red'."""
        shape = self.shape(o)
        if self.extended and self.rng.random() < 0.35:
            return self.choose(
                [
                    f"{shape} that is {colour}",
                    f"{colour}-coloured {shape}",
                    f"{colour} coloured {shape}",
                    f"{shape} in {colour}",
                    f"{colour}ish {shape}" if colour != "white" else f"white {shape}",
                ]
            )
        return f"{colour} {shape}"

    def shape(self, o: SceneObject) -> str:
        return self.pick(SHAPE_WORDS, o.kind)

    def position(self, o: SceneObject) -> str:
        if self.extended and self.rng.random() < 0.5:
            return self.choose(EXTRA_POSITION_WORDS[o.region])
        where = POSITION_WORDS[o.region]
        if where in ("top", "bottom"):
            return f"at the {where}"
        return f"on the {where}" if where in ("left", "right") else f"in the {where}"


def _count(objs: list[SceneObject], **attrs) -> int:
    return sum(all(getattr(o, k) == v for k, v in attrs.items()) for o in objs)


def describe(objs: list[SceneObject], t: int, kind: str, words: _Words) -> str | None:
    """A description naming object t uniquely with this caption kind, or None if impossible."""
    o = objs[t]
    shapes = [x for x in objs if x.kind != TEXT]
    if kind == "text":
        if o.kind != TEXT:
            return None
        return f"the {words.shape(o)}" if _count(objs, kind=TEXT) == 1 else None
    if o.kind == TEXT:
        return None
    if kind == "colour_shape" and _count(objs, kind=o.kind, colour=o.colour) == 1:
        if words.extended:
            return f"the {words.look(o.colour, o)}"
        return f"the {o.colour} {words.shape(o)}"
    if kind == "shape" and _count(objs, kind=o.kind) == 1:
        return f"the {words.shape(o)}"
    if kind == "colour" and _count(shapes, colour=o.colour) == 1:
        noun = ("shape", "object", "one")[words.rng.integers(3)]
        if words.extended:
            noun = words.choose(["shape", "object", "one", *EXTRA_NOUNS])
            if words.rng.random() < 0.25:
                return words.choose(
                    [
                        f"the {noun} that is {o.colour}",
                        f"the {o.colour}-coloured {noun}",
                        f"the {noun} coloured {o.colour}",
                        f"the one in {o.colour}",
                    ]
                )
        return f"the {o.colour} {noun}"
    if kind == "size" and o.size != "medium":
        same = [x for x in objs if x.kind == o.kind and x.colour == o.colour]
        if len(same) >= 2 and sum(x.size == o.size for x in same) == 1:
            if words.extended:
                return f"the {words.pick(SIZE_WORDS, o.size)} {words.look(o.colour, o)}"
            return f"the {words.pick(SIZE_WORDS, o.size)} {o.colour} {words.shape(o)}"
    if kind == "position":
        same = [x for x in objs if x.kind == o.kind and x.colour == o.colour]
        if sum(x.region == o.region for x in same) == 1:
            if words.extended:
                return f"the {words.look(o.colour, o)} {words.position(o)}"
            return f"the {o.colour} {words.shape(o)} {words.position(o)}"
    if kind == "superlative" and len(shapes) >= 2:
        areas = sorted(x.area for x in shapes)
        if o.area == areas[-1] and areas[-1] > 1.6 * areas[-2]:
            if words.extended:
                return words.choose(
                    [
                        "the largest shape",
                        "the biggest shape",
                        "the largest object",
                        *EXTRA_SUPERLATIVES["largest"],
                    ]
                )
            return (
                ("the largest shape", "the biggest shape", "the largest object")[words.rng.integers(3)]
                if not words.heldout
                else ("the biggest one", "the largest thing")[words.rng.integers(2)]
            )
        if o.area == areas[0] and areas[1] > 1.6 * areas[0]:
            if words.extended:
                return words.choose(
                    ["the smallest shape", "the smallest object", *EXTRA_SUPERLATIVES["smallest"]]
                )
            return (
                ("the smallest shape", "the smallest object")[words.rng.integers(2)]
                if not words.heldout
                else ("the tiniest shape", "the smallest thing")[words.rng.integers(2)]
            )
    if kind == "relation":
        return _relation(objs, t, words)
    return None


def _relation(objs: list[SceneObject], t: int, words: _Words) -> str | None:
    o = objs[t]
    for a, anchor in enumerate(objs):
        if a == t or anchor.kind == TEXT or _count(objs, kind=anchor.kind, colour=anchor.colour) != 1:
            continue
        dx, dy = o.cx - anchor.cx, o.cy - anchor.cy
        rel = ("left of" if dx < 0 else "right of") if abs(dx) > abs(dy) else ("above" if dy < 0 else "below")
        # unique: no other object of the target's look stands in the same relation to the anchor
        rivals = [
            x for i, x in enumerate(objs) if i not in (t, a) and x.kind == o.kind and x.colour == o.colour
        ]
        if any(_relation_of(x, anchor) == rel for x in rivals):
            continue
        if words.extended:
            return f"the {words.look(o.colour, o)} {words.pick(RELATIONS, rel)} the {words.look(anchor.colour, anchor)}"
        return f"the {o.colour} {words.shape(o)} {words.pick(RELATIONS, rel)} the {anchor.colour} {words.shape(anchor)}"
    return None


def _relation_of(o: SceneObject, anchor: SceneObject) -> str:
    dx, dy = o.cx - anchor.cx, o.cy - anchor.cy
    return ("left of" if dx < 0 else "right of") if abs(dx) > abs(dy) else ("above" if dy < 0 else "below")


# ----------------------------------------------------------------------------- scenes


def _design(rng: np.random.Generator, kind: str, s: int) -> list[SceneObject]:
    """Objects laid out so a caption of this kind needs its distinguishing word."""
    objs: list[SceneObject] = []

    def add(**kw) -> SceneObject | None:
        o = _new_object(rng, objs, s, **kw)
        if o is not None:
            objs.append(o)
        return o

    shape = SHAPES[rng.integers(len(SHAPES))]
    colour = list(COLOURS)[rng.integers(len(COLOURS))]
    if kind == "size":  # twins that differ only in size
        add(kind=shape, colour=colour, size="small")
        add(kind=shape, colour=colour, size="large")
    elif kind == "position":  # twins in different regions
        add(kind=shape, colour=colour)
        add(kind=shape, colour=colour)
    elif kind in ("colour_shape", "colour"):  # same shape in another colour, same colour on another shape
        add(kind=shape, colour=colour)
        add(kind=shape)
        add(colour=colour if kind == "colour_shape" else None)
    elif kind == "shape":
        add(kind=shape)
        add(colour=colour)
    elif kind == "superlative":
        add(size="large")
        add(size="small")
    elif kind == "relation":  # an anchor and target twins on both sides of it
        anchor = add(size="medium")
        if anchor is not None:
            add(kind=shape, colour=colour, want=lambda x, y: x < anchor.cx - 60 and abs(y - anchor.cy) < 60)
            add(kind=shape, colour=colour, want=lambda x, y: x > anchor.cx + 60 and abs(y - anchor.cy) < 60)
    elif kind == "text":
        add(kind=TEXT, colour=("black", "white", "blue", "red")[rng.integers(4)])
    return objs


def make_scene(
    rng: np.random.Generator,
    config: SceneConfig = SceneConfig(),
    aux: np.random.Generator | None = None,
    knowing: np.random.Generator | None = None,
    regions: np.random.Generator | None = None,
) -> Scene:
    """One scene with up to `captions_per_scene` captions, each naming one object uniquely.

    With config.extra_phrasings (training only) each captioned object gets that many more
    captions of the same kind from the extended vocabulary, drawn from `aux`: `rng` draws exactly
    what it draws without them, so the scenes and their first captions do not change. Likewise
    config.knowing captions come from `knowing`, and config.colour_regions' regions from `regions`
    (the region is the last object, its caption the last caption).
    """
    s = config.size
    words = _Words(rng, config.heldout_phrasing)
    focus = CAPTION_KINDS[rng.integers(len(CAPTION_KINDS))]
    objs = _design(rng, focus, s)
    n = int(rng.integers(config.min_shapes, config.max_shapes + 1))
    for _ in range(max(0, n - len(objs))):
        _new_object_and_add(rng, objs, s)
    if focus != "text" and rng.random() < config.text_prob:
        o = _new_object(rng, objs, s, kind=TEXT, colour=("black", "white")[rng.integers(2)])
        if o is not None:
            objs.append(o)
    region = None
    if config.colour_regions > 0:
        if regions is None:
            raise ValueError("colour regions need an independent generator")
        if regions.random() < config.colour_regions:
            region = _colour_region(regions, objs, s)
    image, masks = render(rng, objs, s, under=None if region is None else (region[2], region[3]))
    for o, m in zip(objs, masks, strict=True):
        o.area = int(m.sum())
    scene = Scene(image, masks, objs)
    kinds = [focus] + [CAPTION_KINDS[i] for i in rng.permutation(len(CAPTION_KINDS))]
    used: set[int] = set()
    for kind in kinds:
        if len(scene.captions) >= config.captions_per_scene:
            break
        for t in rng.permutation(len(objs)):
            if int(t) in used:
                continue
            d = describe(objs, int(t), kind, words)
            if d is not None:
                scene.captions.append((words.frame(d), int(t), kind))
                used.add(int(t))
                break
    if config.extra_phrasings > 0 and not config.heldout_phrasing:
        if aux is None:
            raise ValueError("extra_phrasings needs an independent generator (aux)")
        extended = _Words(aux, heldout=False, extended=True)
        for _, t, kind in list(scene.captions):
            for _ in range(config.extra_phrasings):
                d = describe(objs, t, kind, extended)
                if d is not None:
                    scene.captions.append((extended.frame(d), t, kind))
    if config.knowing > 0:
        if knowing is None:
            raise ValueError("knowing captions need an independent generator")
        scene.captions += knowing_captions(objs, config.knowing, _Words(knowing, config.heldout_phrasing))
    if region is not None:
        # as many captions as an object with its extra phrasings gets (training only)
        n = 1 + (config.extra_phrasings if not config.heldout_phrasing else 0)
        _add_region(scene, *region[:3], _Words(regions, config.heldout_phrasing), n)
    return scene


def _add_region(scene: Scene, colour: str, style: str, mask: np.ndarray, words: _Words, n: int) -> None:
    """The coloured region as the scene's last object (its mask: what the objects leave of it) and
    n captions by its colour."""
    visible = mask & ~scene.masks.any(axis=0)
    ys, xs = np.nonzero(visible)
    s = visible.shape[0]
    cx, cy = float(xs.mean()), float(ys.mean())
    area = int(visible.sum())
    scene.objects.append(SceneObject(REGION, colour, "large", cx, cy, 0.0, _region(cx, cy, s), area))
    scene.masks = np.concatenate([scene.masks, visible[None]])
    for _ in range(n):
        text = words.frame(f"the {colour} {words.choose(REGION_NOUNS[style])}")
        scene.captions.append((text, len(scene.objects) - 1, REGION))


def knowing_captions(objs: list[SceneObject], n: int, words: _Words) -> list[tuple[str, int, str]]:
    """n captions of KNOWING_KINDS (drawn uniformly) for a scene: (text, object or KNOWING_OBJECT, kind)."""
    out: list[tuple[str, int, str]] = []
    for _ in range(n):
        kind = KNOWING_KINDS[words.rng.integers(len(KNOWING_KINDS))]
        phrase = words.pick(KNOWING_WORDS, kind)
        t = KNOWING_OBJECT
        if kind == "edges":  # the outline of one named shape (a text mark's mask is its box: no outline)
            named = []
            for i in words.rng.permutation(len(objs)):
                for how in ("colour_shape", "shape", "colour"):
                    d = describe(objs, int(i), how, words) if objs[int(i)].kind != TEXT else None
                    if d is not None:
                        named.append((int(i), d))
                        break
                if named:
                    break
            if not named:
                continue
            t, d = named[0]
            phrase = phrase.format(d=d)
        out.append((words.frame(phrase), t, kind))
    return out


def _new_object_and_add(rng, objs, s) -> None:
    o = _new_object(rng, objs, s)
    if o is not None:
        objs.append(o)


def render(
    rng: np.random.Generator,
    objs: list[SceneObject],
    s: int,
    under: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw the objects over a background: (image (S, S, 3) uint8, masks (n, S, S) bool).

    A text mark's mask is the box around its strokes: "the text" names the block, not the ink.
    under: (mask, fill) of a coloured region painted over the background, below the objects; it
    keeps a faint copy of the background's texture. It draws nothing from rng.
    """
    canvas = _background(rng, s)
    if under is not None:
        mask, fill = under
        canvas = np.where(
            mask[..., None], np.clip(fill + 0.3 * (canvas - canvas.mean((0, 1))), 0, 255), canvas
        )
    masks = np.zeros((len(objs), s, s), dtype=bool)
    for i, o in enumerate(objs):
        ink_img = Image.new("L", (s, s), 0)
        draw = ImageDraw.Draw(ink_img)
        if o.kind == TEXT:
            _draw_text(draw, rng, o.cx, o.cy, o.radius)
        elif o.kind == "circle":
            draw.ellipse([o.cx - o.radius, o.cy - o.radius, o.cx + o.radius, o.cy + o.radius], fill=255)
        else:
            draw.polygon(_polygon(o.kind, o.cx, o.cy, o.radius, float(rng.uniform(-0.3, 0.3))), fill=255)
        ink = np.asarray(ink_img) > 127
        ys, xs = np.nonzero(ink)
        y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        if o.kind == TEXT:
            masks[i, y0:y1, x0:x1] = True
            fill = np.broadcast_to(np.array(COLOURS[o.colour], np.float32), (y1 - y0, x1 - x0, 3))
        else:
            masks[i] = ink
            fill = _fill(rng, COLOURS[o.colour], y1 - y0, x1 - x0)
        box = canvas[y0:y1, x0:x1]
        canvas[y0:y1, x0:x1] = np.where(ink[y0:y1, x0:x1, None], fill, box)
    noise = rng.normal(0, 3, size=(s, s, 1))  # sensor-like noise so nothing is perfectly flat
    return np.clip(canvas + noise, 0, 255).astype(np.uint8), masks


def make_scenes(n: int, seed: int, config: SceneConfig = SceneConfig()) -> list[Scene]:
    """n scenes from one seed; scenes with no caption are redrawn (same seed, same list)."""
    rng = np.random.default_rng(seed)
    aux = np.random.default_rng([seed, 0xE7]) if config.extra_phrasings > 0 else None
    knowing = np.random.default_rng([seed, 0x6B]) if config.knowing > 0 else None
    regions = np.random.default_rng([seed, 0xC0]) if config.colour_regions > 0 else None
    out: list[Scene] = []
    while len(out) < n:
        scene = make_scene(rng, config, aux, knowing, regions)
        if any(kind in CAPTION_KINDS for _, _, kind in scene.captions):
            out.append(scene)
    return out
