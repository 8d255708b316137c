"""The semantic cache's quality set: paraphrase pairs that should hit and near-miss pairs that
must not, generated (seeded) from varied templates.

    .venv/bin/python -m bench.cache.pairs          # rewrites bench/cache/pairs.jsonl

Every family is one kind of question with three to five wordings and typed slots (a name, a
number, a date, a unit, a polarity). A *paraphrase* pair is two different wordings with the same
slot values. A *near miss* keeps the wording and changes one slot: another entity, number, date,
unit, or the negation, which is the kind of difference that changes the right answer while
leaving most words (and most of an embedding) alone; or, in six families, keeps every slot and
asks another question about it ("other-question": the population instead of the capital), which
no term check sees and only the similarity threshold can refuse. The ``kind`` field says which.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("pairs.jsonl")
SEED = 20261204

COUNTRIES = ["France", "Germany", "Japan", "Brazil", "Canada", "Kenya", "India", "Norway", "Peru", "Egypt",
             "Spain", "Italy", "Mexico", "Chile", "Vietnam", "Poland", "Ghana", "Turkey", "Greece", "Sweden"]
PEOPLE = ["Marie Curie", "Isaac Newton", "Ada Lovelace", "Alan Turing", "Nikola Tesla", "Charles Darwin",
          "Rosalind Franklin", "Albert Einstein", "Grace Hopper", "Leonardo da Vinci", "Jane Austen",
          "Galileo Galilei", "Frida Kahlo", "Niels Bohr", "Emmy Noether"]
LANGS = ["Python", "Rust", "Go", "Java", "Haskell", "Kotlin", "Ruby", "Scala", "Elixir", "Swift"]
CITIES = ["Paris", "Tokyo", "Nairobi", "Toronto", "Lima", "Oslo", "Cairo", "Madrid", "Rome", "Hanoi",
          "Warsaw", "Accra", "Athens", "Stockholm", "Santiago"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
UNITS = [("kilometers", "miles"), ("kilograms", "pounds"), ("liters", "gallons"), ("meters", "feet"),
         ("celsius", "fahrenheit"), ("centimeters", "inches")]
DISHES = ["lasagna", "risotto", "pad thai", "paella", "ramen", "goulash", "falafel", "moussaka", "biryani"]
TOPICS = ["photosynthesis", "inflation", "plate tectonics", "the water cycle", "compound interest",
          "natural selection", "supply and demand", "black holes", "vaccination", "machine learning"]

FAMILIES = [
    {"slots": {"country": COUNTRIES}, "vary": ["country"], "wordings": [
        "What is the capital of {country}?",
        "Which city is the capital of {country}?",
        "Tell me the capital city of {country}.",
        "Name the capital of {country}.",
        "What's {country}'s capital?"],
     "other": ["What is the population of {country}?", "What is the largest city of {country}?",
               "What language is spoken in {country}?", "What currency does {country} use?"]},
    {"slots": {"a": list(range(5, 95, 5)), "b": list(range(120, 990, 20))}, "vary": ["a", "b"], "wordings": [
        "What is {a}% of {b}?",
        "Calculate {a} percent of {b}.",
        "How much is {a}% of {b}?",
        "Compute {a}% of {b}, please."]},
    {"slots": {"n": list(range(2, 60)), "pair": UNITS}, "vary": ["n", "pair"], "wordings": [
        "Convert {n} {src} to {dst}.",
        "How many {dst} are {n} {src}?",
        "What is {n} {src} in {dst}?",
        "Please convert {n} {src} into {dst}."]},
    {"slots": {"person": PEOPLE}, "vary": ["person"], "wordings": [
        "Who was {person}?",
        "Tell me about {person}.",
        "Give me a short biography of {person}.",
        "What is {person} known for?"],
     "other": ["Where was {person} born?", "When did {person} die?", "Who were the parents of {person}?"]},
    {"slots": {"lang": LANGS}, "vary": ["lang"], "wordings": [
        "How do I reverse a list in {lang}?",
        "What's the way to reverse a list in {lang}?",
        "Show me how to reverse a list using {lang}.",
        "In {lang}, how can I reverse a list?"],
     "other": ["How do I sort a list in {lang}?", "How do I reverse a string in {lang}?",
               "How do I remove duplicates from a list in {lang}?", "How do I copy a list in {lang}?"]},
    {"slots": {"city": CITIES, "month": MONTHS}, "vary": ["city", "month"], "wordings": [
        "What is the weather usually like in {city} in {month}?",
        "How is the typical weather in {city} during {month}?",
        "What weather should I expect in {city} in {month}?",
        "Describe the usual climate of {city} in {month}."],
     "other": ["What events happen in {city} in {month}?", "Is {month} a good time to visit {city} on a budget?"]},
    {"slots": {"dish": DISHES, "n": list(range(2, 13))}, "vary": ["n", "dish"], "wordings": [
        "Give me a recipe for {dish} for {n} people.",
        "How do I make {dish} for {n} people?",
        "I need a {dish} recipe that serves {n}.",
        "Write a recipe for {dish} serving {n} people."],
     "other": ["What wine goes well with {dish} for {n} people?", "How many calories are in {dish} for {n} people?"]},
    {"slots": {"topic": TOPICS}, "vary": ["topic"], "wordings": [
        "Explain {topic} in simple terms.",
        "Can you explain {topic} simply?",
        "Describe {topic} in plain language.",
        "What is {topic}? Explain it simply."],
     "other": ["Who discovered {topic}?", "What are common misconceptions about {topic}?",
               "Write a quiz about {topic}.", "What is the history of {topic}?"]},
    {"slots": {"x": list(range(2, 40)), "y": list(range(2, 40))}, "vary": ["x", "y"], "wordings": [
        "What is {x} times {y}?",
        "Multiply {x} by {y}.",
        "What do you get when you multiply {x} and {y}?",
        "Calculate {x} multiplied by {y}."]},
    {"slots": {"city": CITIES, "neg": ["", "not "]}, "vary": ["neg", "city"], "wordings": [
        "Is it {neg}safe to drink tap water in {city}?",
        "Can you {neg}drink the tap water in {city} safely?",
        "Is the tap water in {city} {neg}safe to drink?"]},
    {"slots": {"year": list(range(1900, 2020, 3)), "country": COUNTRIES}, "vary": ["year", "country"], "wordings": [
        "Who led {country} in {year}?",
        "Who was the head of government of {country} in {year}?",
        "In {year}, who was leading {country}?"]},
    {"slots": {"lang": LANGS, "neg": ["", "not "]}, "vary": ["neg", "lang"], "wordings": [
        "Why should I {neg}use {lang} for a web backend?",
        "What are the reasons to {neg}pick {lang} for a web backend?",
        "Give me reasons why I should {neg}choose {lang} for a backend web service."]},
]


def fill(wording: str, values: dict) -> str:
    flat = dict(values)
    if "pair" in flat:
        flat["src"], flat["dst"] = flat.pop("pair")
    text = wording.format(**flat)
    return " ".join(text.split()).replace(" ?", "?")


def generate(per_family_paraphrases: int = 46, per_family_near: int = 46, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    rows, seen = [], set()
    for f_index, family in enumerate(FAMILIES):
        made_p = made_n = 0
        tries = 0
        while (made_p < per_family_paraphrases or made_n < per_family_near) and tries < 10_000:
            tries += 1
            values = {k: rng.choice(v) for k, v in family["slots"].items()}
            if made_p < per_family_paraphrases:
                a, b = rng.sample(family["wordings"], 2)
                pair = (fill(a, values), fill(b, values))
                if pair not in seen and pair[0] != pair[1]:
                    seen.add(pair)
                    rows.append({"a": pair[0], "b": pair[1], "should_hit": True, "kind": "paraphrase",
                                 "family": f_index})
                    made_p += 1
            if made_n < per_family_near and family.get("other") and rng.random() < 0.4:
                # Same names and numbers, another question about them: only the embedding can tell.
                pair = (fill(rng.choice(family["wordings"]), values), fill(rng.choice(family["other"]), values))
                if pair not in seen:
                    seen.add(pair)
                    rows.append({"a": pair[0], "b": pair[1], "should_hit": False, "kind": "other-question",
                                 "family": f_index})
                    made_n += 1
            elif made_n < per_family_near:
                slot = rng.choice(family["vary"])
                other = dict(values)
                choices = [v for v in family["slots"][slot] if v != values[slot]]
                other[slot] = rng.choice(choices)
                wording = rng.choice(family["wordings"])
                pair = (fill(wording, values), fill(wording, other))
                kind = {"neg": "negation", "pair": "unit", "month": "date", "year": "date"}.get(
                    slot, "number" if isinstance(values[slot], int) else "entity")
                if pair not in seen and pair[0] != pair[1]:
                    seen.add(pair)
                    rows.append({"a": pair[0], "b": pair[1], "should_hit": False, "kind": kind, "family": f_index})
                    made_n += 1
    return rows


def main() -> None:
    rows = generate()
    with OUT.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    hits = sum(r["should_hit"] for r in rows)
    print(f"{OUT}: {hits} paraphrase pairs, {len(rows) - hits} near misses")


if __name__ == "__main__":
    main()
