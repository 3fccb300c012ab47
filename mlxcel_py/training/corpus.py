"""The prompts a drafter is trained on: a built-in set every machine has (subjects x ways of
asking, prose on purpose: that is where n-gram drafting cannot help), and/or the user's JSONL.

A JSONL line is {"prompt": "..."}, {"text": "..."} or {"messages": [...]} (a chat trace: the
user turns up to the last are the prompt). A fixed share of prompts is held back (never trained
on) to measure acceptance as training goes; the held-out public workload's subjects are not in
the built-in set at all.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..inputs.files import MIB, UnreadableFile, read_text

SUBJECTS = (
    "the ocean tides|how volcanoes form|a day at the market|the history of bread|why leaves change color|"
    "a lighthouse keeper|learning to swim|the moon landing|how bees make honey|a rainy afternoon|the first snow|"
    "a trip to the mountains|how trains work|a lost umbrella|the life of a tree|friendship|an old library|"
    "how to plant a garden|the northern lights|a robot who paints|the importance of sleep|a small town bakery|"
    "how rainbows form|a dog who waits at the station|the printing press|a walk in the forest|"
    "why the sky is blue|a letter to a future self|how computers store data|the desert at night|a chess game|"
    "a family recipe|the migration of birds|how to make tea|a musician's first concert|the seasons|"
    "a city at dawn|how clocks keep time|a shipwreck|the joy of reading|a mountain village|how wind turbines work|"
    "an island adventure|the coral reef|a kind stranger|the history of the wheel|a summer festival|"
    "how paper is made|a night train|the sound of the sea|a detective story|the power of habits|"
    "how glaciers move|a painter's studio|the stars|a broken clock|learning a new language|a farmer's morning|"
    "how the heart works|a snowy cabin|the wind|a school play|how bridges are built|a garden of herbs|"
    "the history of maps|a fox in the city|how to stay calm|a red balloon|the river|a village fair|"
    "how solar panels work|a storm at sea|the meaning of home|a baker's apprentice|how ants cooperate|"
    "a quiet morning|the first airplane|a secret door|how memory works|a kite festival|the old bridge|"
    "a time traveler|how salt is made|a forest after a fire|a birthday surprise|the art of listening|"
    "how to write a letter|a mountain climber|the history of music|a lonely whale|how coffee is grown|"
    "a winter market|the city park|a girl who collects stones|how the internet connects people|kindness|"
    "a journey by canoe|how earthquakes happen|a lantern in the window|the harvest|saving money|"
    "a museum at night|how vaccines work|the history of chess|a fishing village|how plants drink water|"
    "an astronaut's day|a bookshop cat|the first telephone|how to cook rice|a camping trip|the moon|"
    "how magnets work|a street musician|the history of tea|a lost key|how a bicycle stays upright|"
    "a dragon who is afraid of fire|the desert oasis|how rivers shape valleys|a grandmother's garden|"
    "the value of patience|a train station in winter|how owls hunt|a letter that arrived late|"
    "the invention of glass|a small boat on a big lake|how snowflakes form|a teacher who changed a life|"
    "the life of a honeybee|a village without electricity|how thunder happens|an apple orchard"
).split("|")
STYLES = (
    "Write about {}.",
    "Tell a short story about {}.",
    "Explain {} to a child.",
    "Describe {}.",
    "Write a short essay on {}.",
    "What is interesting about {}?",
)
HELD_OUT_SHARE = 0.05


@dataclass(frozen=True)
class Prompts:
    train: list[str]
    held_out: list[str]


def builtin() -> list[str]:
    return [style.format(s.strip()) for s in SUBJECTS for style in STYLES]


def _line_prompt(line: str, where: str) -> str:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f'{where}: not JSON ({exc.msg}); each line is {{"prompt": ...}} or {{"messages": [...]}}'
        ) from None
    if isinstance(item, dict):
        for key in ("prompt", "text"):
            if isinstance(item.get(key), str) and item[key].strip():
                return item[key]
        msgs = item.get("messages")
        if isinstance(msgs, list):
            users = [m.get("content") for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
            if users and isinstance(users[-1], str) and users[-1].strip():
                return users[-1]
    raise UsageError(f'{where}: no "prompt", "text" or user message in the line')


def read_jsonl(path: Path) -> list[str]:
    try:
        text = read_text(path, 64 * MIB)
    except UnreadableFile as exc:
        raise UsageError(f"--prompts {path}: {exc}") from None
    out = [_line_prompt(ln, f"--prompts {path} line {i}") for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not out:
        raise UsageError(f"--prompts {path}: the file holds no prompts")
    return out


def gather(files: list[Path], seed: int, use_builtin: bool = True) -> Prompts:
    """Every prompt once, shuffled by `seed`; a share (at least one) held back."""
    prompts = (builtin() if use_builtin else []) + [p for f in files for p in read_jsonl(f)]
    prompts = list(dict.fromkeys(prompts))
    random.Random(seed).shuffle(prompts)
    held = max(1, int(len(prompts) * HELD_OUT_SHARE)) if len(prompts) > 1 else 0
    return Prompts(train=prompts[held:], held_out=prompts[:held])
