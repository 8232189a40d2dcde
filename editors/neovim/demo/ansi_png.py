"""Renders a `tmux capture-pane -e` screen (SGR colours) to a PNG, like a terminal screenshot.
    python ansi_png.py SCREEN.ansi OUT.png WIDTH HEIGHT"""
import re
import sys

from PIL import Image, ImageDraw, ImageFont

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
BASE16 = [(0, 0, 0), (205, 49, 49), (13, 188, 121), (229, 229, 16), (36, 114, 200), (188, 63, 188),
          (17, 168, 205), (229, 229, 229), (102, 102, 102), (241, 76, 76), (35, 209, 139), (245, 245, 67),
          (59, 142, 234), (214, 112, 214), (41, 184, 219), (255, 255, 255)]
FG, BG = (220, 220, 220), (24, 24, 28)


def xterm256(n: int) -> tuple[int, int, int]:
    if n < 16:
        return BASE16[n]
    if n < 232:
        n -= 16
        steps = [0, 95, 135, 175, 215, 255]
        return steps[n // 36], steps[(n // 6) % 6], steps[n % 6]
    v = 8 + 10 * (n - 232)
    return v, v, v


def cells(line: str):
    """(char, fg, bg, bold) per cell of one captured line."""
    fg, bg, bold, rev = FG, BG, False, False
    out = []
    for part in re.split(r"(\x1b\[[0-9;]*m)", line):
        if part.startswith("\x1b["):
            codes = [int(c) if c else 0 for c in part[2:-1].split(";")]
            i = 0
            while i < len(codes):
                c = codes[i]
                if c == 0:
                    fg, bg, bold, rev = FG, BG, False, False
                elif c == 1:
                    bold = True
                elif c == 7:
                    rev = True
                elif c == 22:
                    bold = False
                elif c == 27:
                    rev = False
                elif 30 <= c <= 37:
                    fg = BASE16[c - 30]
                elif 90 <= c <= 97:
                    fg = BASE16[c - 90 + 8]
                elif 40 <= c <= 47:
                    bg = BASE16[c - 40]
                elif 100 <= c <= 107:
                    bg = BASE16[c - 100 + 8]
                elif c == 39:
                    fg = FG
                elif c == 49:
                    bg = BG
                elif c in (38, 48) and i + 2 < len(codes) and codes[i + 1] == 5:
                    col = xterm256(codes[i + 2])
                    fg, bg = (col, bg) if c == 38 else (fg, col)
                    i += 2
                elif c in (38, 48) and i + 4 < len(codes) and codes[i + 1] == 2:
                    col = tuple(codes[i + 2:i + 5])
                    fg, bg = (col, bg) if c == 38 else (fg, col)
                    i += 4
                i += 1
        else:
            for ch in part:
                out.append((ch, bg if rev else fg, fg if rev else bg, bold))
    return out


def main() -> None:
    src, dest, w, h = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    font = ImageFont.truetype(FONT, 15)
    cw = int(font.getlength("M"))
    ch = 20
    img = Image.new("RGB", (w * cw + 16, h * ch + 16), BG)
    draw = ImageDraw.Draw(img)
    for row, line in enumerate(open(src, encoding="utf-8", errors="replace").read().split("\n")[:h]):
        for col, (c, fg, bg, _) in enumerate(cells(line)[:w]):
            x, y = 8 + col * cw, 8 + row * ch
            if bg != BG:
                draw.rectangle([x, y, x + cw, y + ch], fill=bg)
            draw.text((x, y + 2), c, font=font, fill=fg)
    img.save(dest)


if __name__ == "__main__":
    main()
