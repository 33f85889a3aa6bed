"""Procedural drawing for the gym_cards tasks, with Pillow only: felt, card faces, text lines.

Everything is drawn on a 300x300 canvas (the original tasks' size) with Pillow's built-in
scalable font, then resized to the requested size, so an image depends only on the game
state: the same state always gives the same pixels.
"""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image, ImageDraw, ImageFont

CANVAS = 300
FELT = (20, 110, 50)
SUITS = ("spades", "hearts", "diamonds", "clubs")
_SUIT_COLOURS = {"spades": (20, 20, 20), "clubs": (20, 20, 20), "hearts": (200, 20, 30), "diamonds": (200, 20, 30)}
RANK_NAMES = {1: "A", 11: "J", 12: "Q", 13: "K"}


@functools.cache
def font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def rank_name(rank: int) -> str:
    return RANK_NAMES.get(rank, str(rank))


def canvas(background=FELT) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    image = Image.new("RGB", (CANVAS, CANVAS), background)
    return image, ImageDraw.Draw(image)


def _suit_mark(draw: ImageDraw.ImageDraw, suit: str, cx: float, cy: float, r: float) -> None:
    """A simple geometric suit symbol centred at (cx, cy)."""
    colour = _SUIT_COLOURS[suit]
    if suit == "diamonds":
        draw.polygon([(cx, cy - r), (cx + r * 0.7, cy), (cx, cy + r), (cx - r * 0.7, cy)], fill=colour)
    elif suit == "hearts":
        draw.ellipse([cx - r, cy - r * 0.8, cx, cy + r * 0.1], fill=colour)
        draw.ellipse([cx, cy - r * 0.8, cx + r, cy + r * 0.1], fill=colour)
        draw.polygon([(cx - r, cy - r * 0.25), (cx + r, cy - r * 0.25), (cx, cy + r)], fill=colour)
    elif suit == "spades":
        draw.polygon([(cx, cy - r), (cx + r, cy + r * 0.2), (cx - r, cy + r * 0.2)], fill=colour)
        draw.ellipse([cx - r, cy - r * 0.1, cx, cy + r * 0.6], fill=colour)
        draw.ellipse([cx, cy - r * 0.1, cx + r, cy + r * 0.6], fill=colour)
        draw.polygon([(cx, cy + r * 0.2), (cx + r * 0.35, cy + r), (cx - r * 0.35, cy + r)], fill=colour)
    else:  # clubs
        for dx, dy in ((0, -0.45), (-0.45, 0.15), (0.45, 0.15)):
            draw.ellipse([cx + (dx - 0.4) * r, cy + (dy - 0.4) * r, cx + (dx + 0.4) * r, cy + (dy + 0.4) * r],
                         fill=colour)
        draw.polygon([(cx, cy), (cx + r * 0.35, cy + r), (cx - r * 0.35, cy + r)], fill=colour)


def card(draw: ImageDraw.ImageDraw, x: float, y: float, w: float, h: float, rank: int | None,
         suit: str | None) -> None:
    """A card at (x, y) of size w x h: a white face with its rank and suit, or a back when rank is None."""
    if rank is None:
        draw.rounded_rectangle([x, y, x + w, y + h], radius=w * 0.1, fill=(40, 60, 160), outline=(240, 240, 240),
                               width=2)
        draw.rectangle([x + w * 0.15, y + h * 0.1, x + w * 0.85, y + h * 0.9], outline=(200, 200, 240), width=2)
        return
    draw.rounded_rectangle([x, y, x + w, y + h], radius=w * 0.1, fill=(250, 250, 245), outline=(30, 30, 30), width=2)
    colour = _SUIT_COLOURS[suit]
    # Large, thickened ranks, so that a 64x64 image still tells a 3 from an 8.
    draw.text((x + w * 0.5, y + h * 0.3), rank_name(rank), fill=colour, font=font(int(h * 0.42)), anchor="mm",
              stroke_width=max(1, round(h * 0.02)), stroke_fill=colour)
    _suit_mark(draw, suit, x + w * 0.5, y + h * 0.72, w * 0.22)


def text_line(draw: ImageDraw.ImageDraw, y: float, text: str, size: int = 28, colour=(255, 255, 255),
              bold: int = 0) -> None:
    """A centred line; `bold` thickens the strokes by that many pixels, so digits survive downscaling.

    A line too long for the canvas (a long Points24 formula) is drawn smaller to fit.
    """
    while size > 8 and draw.textlength(text, font=font(size)) + 2 * bold > CANVAS - 10:
        size -= 2
    draw.text((CANVAS / 2, y), text, fill=colour, font=font(size), anchor="mm", stroke_width=bold, stroke_fill=colour)


def to_array(image: Image.Image, size: int) -> np.ndarray:
    """[size, size, 3] uint8."""
    if size != CANVAS:
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.uint8)
