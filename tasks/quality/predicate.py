"""Is this LLM answer a document? The one predicate, with a named reason per rejected text.

Generation (regeneration and best-of-k), private evolution (which candidates may vote) and the release gate
(``q_document_reason``) all call ``document_rejection``; there is no second definition. It reads only a synthetic
text, its released seed terms, the call's public finish reason and, when the backend gives it, the answer's mean
token log-probability, so it costs no privacy wherever it runs.

Most reasons are measured statistics with thresholds (``DocumentRules``) chosen on public real text: the Gopher
quality and repetition statistics (``text_stats``), a language identifier (``language``), the model's own fluency.
What statistics cannot see -- what the words say -- is in ``patterns.json`` (``patterns``) and the seed-shape
tests (``shapes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from privseed.tasks.errors import ConfigError
from privseed.tasks.quality.language import LANGUAGES, language_probability
from privseed.tasks.quality.patterns import chat_frame_markers, hostility, meta_talk, template_residue
from privseed.tasks.quality.shapes import (WebMarkup, _longest_phrase_run, _longest_token_run, _singular, _tokens,
                                           article_list, doubled_phrase, borrows_example_name, copies_example,
                                           ends_a_sentence, fragment_lines, glossary_headers, is_keyphrase_passthrough,
                                           longest_seed_run, markdown_labels, opens_with_name, opens_with_name_loosely,
                                           quoted_term_glosses,
                                           seed_definitions,
                                           seed_gloss_terms, seed_glosses, seed_label_terms, seed_labels,
                                           seed_line_labels, seed_run_terms, short_item_run, syllable_loop,
                                           term_glosses, web_markup, word_glosses)
from privseed.tasks.quality.text_stats import TextStats, text_stats

#: The named reasons, in the order they are tested (the first that applies is reported).
REJECTION_REASONS: tuple[str, ...] = (
    "not_text",          # None, a number, ... instead of a string
    "too_short",         # fewer than min_words words (a failed call, "Lullaby.")
    "too_long",          # more than max_words words (a runaway generation)
    "prompt_residue",    # the prompt or chat-template control tokens copied into the answer (patterns.json)
    "seed_echo",         # the seed list given back (alone, or as a run of seed terms inside the text)
    "meta_talk",         # the assistant talking ("I'm an AI", "Sure, here is", "the terms ...") (patterns.json)
    "web_markup",        # links and tags as spam has them: a text that opens with a link or is mostly links, several
                         # links, several hashtags / @handles (patterns.json web_markup)
    "chat_frame",        # a chat message or letter around the text: two of the markers patterns.json chat_frame names
                         # (a greeting to a crowd, "I hope this message finds you well", a sign-off, ...)
    "hostile",           # says a group of people is evil or should be harmed ("Islamism is an evil and violent
                         # religion", issue 48): one is enough (patterns.json hostility)
    "repetition_loop",   # a token or phrase back to back ("Australia, Australia, ..."), a phrase of 3+ words doubled
                         # inside a clause ("the island of the island of"), letters looping in a word
    "repetitive",        # Gopher repetition statistics: duplicate lines / paragraphs, top 2-4-gram and duplicated
                         # 5-10-gram character shares
    "not_prose",         # Gopher quality statistics: stop words, mean word length, symbols, bullet / ellipsis
                         # lines, words without letters; a list of capitalised words; a word written twice glued
    "fragments",         # most lines one to three words, or "a city, a glassy, a live, ...": a list, not prose
    "copies_example",    # a run of words copied from a few-shot example of the prompt (the example, not a document)
    "names_class",       # opens with its class's public name as the subject ("The Album is a ..."): the
                         # category written about, not a document of it (only when the prompts named the classes)
    "glossary",          # "Term: definition. Term: definition.", "The X is ... The Y is ...", "### X / ### Y"
    "wrong_language",    # the language identifier gives the declared language less than min_language_prob
    "disfluent",         # the model's own mean token log-probability of the answer under min_mean_logprob
    "truncated",         # stopped at the token limit in the middle of a sentence
)


@dataclass(frozen=True)
class DocumentRules:
    """Thresholds of ``document_rejection``. The statistics' thresholds were chosen on public real text: the
    tuning splits (DBPedia-14 train, OHSUMED-23 train, Yelp dev) set them, each at or beyond what real documents
    reach, and the test splits of the same corpora and Medical Abstracts (never seen in tuning) measure the false
    rejects: at most 0.5 % per corpus (``benchmarks/document_predicate_real.py``, experiments/results/generation.md)."""

    min_words: int = 5
    max_words: int = 2000
    # The same token back to back this many times ("Australia, Australia, Australia, Australia"); the same 2..6-word
    # phrase back to back this many times ("of the arm of the arm of the arm of the arm").
    max_token_run: int = 4
    max_phrase_run: int = 4
    # A phrase of this many words or more written twice back to back inside one clause ("the island of the island
    # of"): a stutter. 0.02-0.18 % of the real texts of the public corpora have one (a title run into its abstract).
    min_doubled_phrase_words: int = 3
    # Gopher repetition (Rae et al. 2021, Table A1: 0.30 / 0.30 / 0.20 / 0.20 for lines and paragraphs, 0.20 / 0.18 /
    # 0.16 for the top 2/3/4-gram, 0.15 .. 0.10 for duplicated 5..10-grams, made for web pages of 50+ words). Each
    # is Gopher's value, or, where real paragraphs of the tuning splits reach past it, the largest value they reach
    # (rounded up to 0.01): a short abstract that names its subject three times has a large top 2-gram share, and
    # at their 99.9th percentiles the eleven statistics together would reject 0.4-0.7 % of real documents. n-gram
    # shares are measured on texts of at least `repetition_min_words` words.
    max_dup_line_frac: float = 0.30
    max_dup_para_frac: float = 0.30
    max_dup_line_char_frac: float = 0.20
    max_dup_para_char_frac: float = 0.20
    max_top_2gram_char_frac: float = 0.38
    max_top_3gram_char_frac: float = 0.33
    max_top_4gram_char_frac: float = 0.35
    max_dup_5gram_char_frac: float = 0.25
    max_dup_6gram_char_frac: float = 0.22
    max_dup_7gram_char_frac: float = 0.24
    max_dup_8gram_char_frac: float = 0.18
    max_dup_9gram_char_frac: float = 0.13
    max_dup_10gram_char_frac: float = 0.14
    repetition_min_words: int = 20
    # Moving-average type-token ratio (50-word windows), texts of at least `mattr_min_words` words: the tuning
    # splits' 0.1th percentile is 0.55 (DBPedia-14), their minimum 0.45; loops go round in few words (0.24).
    min_mattr: float = 0.45
    mattr_min_words: int = 30
    # Gopher quality (Rae et al. 2021, A.1.1), on texts of at least `quality_min_words` words: symbol-to-word ratio
    # ("#" and ellipses, a run of dots counted once) at most 0.1 (Yelp dev reaches 0.14, so 0.15); at most 90 % of
    # lines bullets and 30 % ending in an ellipsis (texts of 3 lines or more: a one-line review may end "...");
    # 80 % of words with a letter (DBPedia-14's dates and numbers reach down to 0.63, so 0.62); mean word length
    # 3..10; at least 2 of the 8 stop words "the, be, to, of, and, that, have, with" in documents of 50 words and
    # more (Gopher's shortest document). Encyclopedic paragraphs and reviews often use none of them ("X is an
    # American company based in ..."): 2 of them rejects 0.3 % of DBPedia-14 train, 1 of them 0.04 %, hence 1
    # (English only: the list is English).
    quality_min_words: int = 20
    max_symbol_word_ratio: float = 0.15
    max_bullet_line_frac: float = 0.9
    max_ellipsis_line_frac: float = 0.3
    min_alpha_word_frac: float = 0.62
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    min_stop_words: int = 1
    stop_word_min_words: int = 50
    # Characters in comma-separated lists of six or more capitalised one- or two-word items ("Singer, Hammy,
    # Drying, Rooftop, Rowling, Ctf, Nederland, Company, ...") over all characters: the seed list capitalised.
    max_capital_list_chars: float = 0.2
    # Words with a group of six letters or more, three of them distinct, written twice back to back
    # ("RomanAdministrativeAdministrative", "robertrobertro"): more than this many. Real text has them rarely:
    # DBPedia-14's titles glued to the text ("BellwortBellwort", "AquinasAquinas"), 0.06 % of its train split.
    max_doubled_group_words: int = 0
    # A run of this many seed terms joined only by separators (commas, "and", newlines, bullets) inside the text.
    max_seed_run: int = 5
    # A text of at least `fragment_min_lines` non-empty lines, more than `max_fragment_share` of them one to three
    # words long, is fragments, not prose.
    fragment_min_lines: int = 6
    max_fragment_share: float = 0.6
    # Items of one or two words in a row in one sentence (``short_item_run``): at most this many. The longest real
    # lists of the tuning splits: 15 (OHSUMED-23 train, drug and symptom lists), 13 (Yelp dev, dishes), 10
    # (DBPedia-14 train); no test split goes past 15 either. The demo's seed list with its variants ("The Good,
    # Media, Year, published, written work, English, reviewed, ...") runs to 23.
    max_short_item_run: int = 15
    # Glossaries of the seeds (see privseed.tasks.quality.shapes): "Term:" entries, markdown headings or bold
    # labels, "a term that ..." glosses; seed terms opening lines as labels; quoted words explained; seed terms
    # opening sentences that define them.
    max_glossary_headers: int = 3
    max_seed_line_labels: int = 2
    max_quoted_term_glosses: int = 2
    max_seed_definitions: int = 4
    # Words explained as words ("a term used to ...", "the term X refers to ...", "a phrase used to describe"):
    # once is prose, twice none of the 29,388 real texts of the four public corpora, two to six times SmolLM2's demo
    # glossaries of its seeds (`term_glosses`).
    max_term_glosses: int = 2
    # Content words glossed inside running prose ("growth refers to ..., hypothesis pertains to ..., site denotes
    # ..."): none of the real texts has two, with every word of it counted (`word_glosses`).
    max_word_glosses: int = 2
    # Links and tags (``shapes.web_markup``; issue 48: 16 % of a local model's forum-post rows had made-up links, 0.03 %
    # of the real posts; 13 % hashtags or @handles, 1.5 % of the real posts). A link may be a forum post's or a
    # review's, so one or two are allowed; what real texts rarely have is rejected: a text that opens with a link,
    # links making up `max_link_share` of its non-space characters, `max_links` links, `max_tags` hashtags and
    # @handles (a tweet's one or two stay). The four public corpora: see docs/generation.md for the measured rates.
    max_links: int = 3
    max_link_share: float = 0.5
    reject_opening_link: bool = True
    max_tags: int = 3
    # Chat-frame markers (patterns.json ``chat_frame``): this many distinct ones are a chat message around the text
    # ("Hello all, / I hope this message finds you well! I'm writing to share ..."); one is a real post's manner.
    max_chat_markers: int = 2
    # The corpus's declared language (None: no language test): a text of at least `language_min_words` words
    # whose probability of being in it (py3langid) is under `min_language_prob` is in another language.
    language: str | None = "en"
    min_language_prob: float = 0.01
    language_min_words: int = 12
    # The answer's mean token log-probability under the model that wrote it, when the backend reports it (None:
    # no fluency test). Off by default: no real text has a log-probability under the generator to choose it on.
    min_mean_logprob: float | None = None
    # The call stopped at max_tokens ("length") and the text does not end a sentence.
    reject_truncated: bool = True
    # Not reasons: a document this repetitive is kept, but generation asks for another candidate
    # (GenerationParams.max_rewrites) and keeps the less repetitive one (``repetition_score`` >= 1). One content
    # word `rewrite_crowded_word` times in 40 words, or a moving type-token ratio at or under `rewrite_mattr` (texts
    # of `mattr_min_words` words or more). Real documents reach either rarely (DBPedia-14 0.4-0.6 %, Yelp 0.1 %,
    # OHSUMED-23 2.4 % and Medical Abstracts 2.8 %, whose abstracts name their subject often; a type-token ratio
    # of 0.55 or less: at most 0.06 % of any corpus); every SmolLM2 demo document read at 0.55 or less circles
    # ("a natural place that is known for its beauty and beauty ... a natural thing that is known"), which the
    # hard thresholds cannot take without rejecting real text (experiments/results/generation.md).
    rewrite_crowded_word: int = 6
    rewrite_mattr: float = 0.55
    # Also not a reason: `rewrite_seed_labels` distinct seed terms opening a sentence inside the text as a label
    # ("... for schools. Suburb: A small town or valley is ..."), the way SmolLM2 glosses a seed it could not place
    # at the default repeat penalty (4 of 20 demo rows read, 2026-11-27). Real texts: 0-0.03 % of DBPedia-14,
    # OHSUMED-23 and Medical Abstracts, 0.1-0.3 % of Yelp reviews ("Pros: ... Cons: ...").
    rewrite_seed_labels: int = 1
    # Also not reasons: a run of `rewrite_seed_run` seed terms joined only by separators ("originated in andrew,
    # john, born, best"; `max_seed_run` rejects at 5), and `rewrite_term_glosses` words explained as words ("july
    # is another term used when referring to abdul"; `max_term_glosses` rejects at 2): a seed stuffed into a
    # sentence or explained instead of used. Real texts (their first ten public-vocabulary words as the seed):
    # runs of 3 in 0.2 % of DBPedia-14, 1.9-2.3 % of OHSUMED-23 and Medical Abstracts, 3.3-3.6 % of Yelp (lists of
    # dishes and symptoms); one gloss in at most 0.05 % of any corpus.
    rewrite_seed_run: int = 3
    rewrite_term_glosses: int = 1
    # Also not a reason: `rewrite_seed_glosses` seed terms explained as words ('The name "Panama" refers to ...',
    # "Counsel refers to a group of trees", "war, which means ..."; `seed_glosses`): 8 of the 84 rows of the demo
    # release of 2026-11-27. Real texts with their own first ten terms as the seed: 0.07-0.34 % of each corpus.
    rewrite_seed_glosses: int = 1
    # Also not reasons: `rewrite_links` links, `rewrite_tags` hashtags or @handles, `rewrite_chat_markers` chat-frame
    # markers (a greeting to a crowd, a sign-off): under the rejecting thresholds above, a real post's link or
    # greeting is kept, but generation asks once more for a plain document (issue 48's rows had them 4.5-500 times as
    # often as the real posts).
    rewrite_links: int = 1
    rewrite_tags: int = 1
    rewrite_chat_markers: int = 1
    # The few-shot example documents of the prompt (public, from the recipient): a text that shares a run of
    # `max_example_run` words with one of them, or names one of their entities none of its seed terms is part of,
    # copies the example instead of writing from its seed. Empty: no test.
    examples: tuple[str, ...] = ()
    max_example_run: int = 8
    # The owner's public class names (label, name) when the prompts named them (``--class-names``; empty: no test):
    # a text that opens with its own class's name as its subject, at the very start or after a determiner with the
    # owner's capitals (``opens_with_name``), writes about the category ("Album is a rock band from the United
    # States", "The Album is a French-Italian fashion brand"). SmolLM2 did in 3.5-22 % of rows on three corpora
    # (issue 48); real texts of the public corpora, 0-0.04 %.
    class_names: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.min_words <= self.max_words:
            raise ConfigError(f"document rules: need 0 <= min_words <= max_words, "
                              f"got {self.min_words}..{self.max_words}")
        for f in fields(self):
            value = getattr(self, f.name)
            if (f.name.endswith(("_frac", "_prob", "_share", "_chars", "mattr")) and isinstance(value, float)
                    and not 0.0 <= value <= 1.0):
                raise ConfigError(f"document rules: {f.name}={value} must be in [0, 1]")
        for name in ("max_token_run", "max_phrase_run", "min_doubled_phrase_words", "max_seed_run", "max_example_run",
                     "max_seed_line_labels", "max_quoted_term_glosses", "max_term_glosses", "max_word_glosses",
                     "rewrite_crowded_word"):
            if int(getattr(self, name)) < 2:
                raise ConfigError(f"document rules: {name}={getattr(self, name)} must be >= 2")
        for name in ("rewrite_seed_labels", "rewrite_seed_run", "rewrite_term_glosses", "rewrite_seed_glosses",
                     "max_links", "max_tags", "max_chat_markers", "rewrite_links", "rewrite_tags",
                     "rewrite_chat_markers"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"document rules: {name}={getattr(self, name)} must be >= 1")
        if self.language is not None and self.language not in LANGUAGES:
            raise ConfigError(f"document rules: unknown language {self.language!r}; known: ISO 639 codes such as "
                              "en, de, fr, es (or None to skip the language test)")

    def with_settings(self, settings: Mapping[str, Any]) -> DocumentRules:
        """These rules with some thresholds set by name, as the owner's configuration gives them
        (``--document-rule max_seed_line_labels=4``, ``--document-rule min_mean_logprob=-2.5``; values may be
        text). The language and the word bounds have their own settings and the few-shot examples come from the
        prompt, so none of them is set here (``TUNABLE_RULES``)."""
        if not settings:
            return self
        values: dict[str, Any] = {}
        for name, value in settings.items():
            if name not in TUNABLE_RULES:
                raise ConfigError(f"unknown document rule {name!r}; known: {', '.join(TUNABLE_RULES)}")
            kind = _RULE_TYPES[name]
            try:
                if kind is bool:
                    text = str(value).strip().lower()
                    if text not in ("true", "false", "1", "0", "yes", "no"):
                        raise ValueError(text)
                    values[name] = text in ("true", "1", "yes")
                elif kind is int:
                    number = float(value)
                    if not number.is_integer():
                        raise ValueError(value)
                    values[name] = int(number)
                elif value is None or str(value).strip().lower() in ("none", "off"):
                    if getattr(DEFAULT_RULES, name) is not None:
                        raise ValueError(value)
                    values[name] = None
                else:
                    values[name] = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"document rule {name}={value!r}: expected {kind.__name__}") from None
        return replace(self, **values)


DEFAULT_RULES = DocumentRules()
#: The thresholds an owner may set by name (``DocumentRules.with_settings``): every rule but the language (its own
#: option), the few-shot examples (taken from the prompt) and the word bounds (the release gate's, one source for
#: both: ``rules_from_bounds``).
TUNABLE_RULES: tuple[str, ...] = tuple(f.name for f in fields(DocumentRules)
                                       if f.name not in ("language", "examples", "class_names", "min_words",
                                                         "max_words"))
_RULE_TYPES: dict[str, type] = {name: (float if getattr(DEFAULT_RULES, name) is None
                                       else type(getattr(DEFAULT_RULES, name))) for name in TUNABLE_RULES}


def repetitive(stats: TextStats, rules: DocumentRules) -> str | None:
    """The Gopher repetition statistic over its threshold, by name, or None."""
    if stats.dup_line_frac > rules.max_dup_line_frac:
        return "dup_line_frac"
    if stats.dup_para_frac > rules.max_dup_para_frac:
        return "dup_para_frac"
    if stats.dup_line_char_frac > rules.max_dup_line_char_frac:
        return "dup_line_char_frac"
    if stats.dup_para_char_frac > rules.max_dup_para_char_frac:
        return "dup_para_char_frac"
    if stats.words >= rules.mattr_min_words and stats.mattr < rules.min_mattr:
        return "mattr"
    if stats.words < rules.repetition_min_words:
        return None
    tops = (rules.max_top_2gram_char_frac, rules.max_top_3gram_char_frac, rules.max_top_4gram_char_frac)
    for n, (value, limit) in enumerate(zip(stats.top_ngram_char_frac, tops), start=2):
        if value > limit:
            return f"top_{n}gram_char_frac"
    dups = (rules.max_dup_5gram_char_frac, rules.max_dup_6gram_char_frac, rules.max_dup_7gram_char_frac,
            rules.max_dup_8gram_char_frac, rules.max_dup_9gram_char_frac, rules.max_dup_10gram_char_frac)
    for n, (value, limit) in enumerate(zip(stats.dup_ngram_char_frac, dups), start=5):
        if value > limit:
            return f"dup_{n}gram_char_frac"
    return None


def not_prose(stats: TextStats, rules: DocumentRules) -> str | None:
    """The Gopher quality statistic (or capitalised list, or glued doubled word) over its threshold, or None."""
    if stats.capital_list_chars > rules.max_capital_list_chars:
        return "capital_list_chars"
    if stats.doubled_groups > rules.max_doubled_group_words:
        return "doubled_group_words"
    if stats.words < rules.quality_min_words:
        return None
    if stats.symbol_word_ratio > rules.max_symbol_word_ratio:
        return "symbol_word_ratio"
    if stats.lines >= 3 and stats.bullet_line_frac > rules.max_bullet_line_frac:
        return "bullet_line_frac"
    if stats.lines >= 3 and stats.ellipsis_line_frac > rules.max_ellipsis_line_frac:
        return "ellipsis_line_frac"
    if stats.alpha_word_frac < rules.min_alpha_word_frac:
        return "alpha_word_frac"
    if not rules.min_mean_word_length <= stats.mean_word_length <= rules.max_mean_word_length:
        return "mean_word_length"
    if (rules.language == "en" and stats.words >= rules.stop_word_min_words
            and stats.stop_words < rules.min_stop_words):
        return "stop_words"
    return None


def spam_markup(markup: WebMarkup, rules: DocumentRules) -> str | None:
    """Which of the links-and-tags thresholds ``markup`` reaches, by name, or None: the text opens with a link, its
    links make up ``max_link_share`` of it, it has ``max_links`` links or ``max_tags`` hashtags and @handles."""
    if rules.reject_opening_link and markup.opens_with_link:
        return "opening_link"
    if markup.link_share >= rules.max_link_share:
        return "link_share"
    if markup.links >= rules.max_links:
        return "links"
    if markup.tags >= rules.max_tags:
        return "tags"
    return None


def document_rejection(text: Any, keyphrases: Any = (), finish_reason: str | None = None,
                       rules: DocumentRules = DEFAULT_RULES, mean_logprob: float | None = None,
                       label: Any = None) -> str | None:
    """Why ``text`` is not a document (one of REJECTION_REASONS), or None when it is one.

    ``keyphrases`` are the released seed terms the text was written from (for the echo tests; empty skips
    them); ``finish_reason`` is the call's ("length" when it stopped at max_tokens; None when unknown);
    ``mean_logprob`` is the answer's mean token log-probability when the backend reports it (None: unknown);
    ``label`` is the row's public label, for the class-name test (``rules.class_names``; None skips it).
    """
    if not isinstance(text, str):
        return "not_text"
    words = text.split()
    if len(words) < rules.min_words:
        return "too_short"
    if len(words) > rules.max_words:
        return "too_long"
    if template_residue(text) is not None:
        return "prompt_residue"
    if is_keyphrase_passthrough(text, keyphrases) or longest_seed_run(text, keyphrases) >= rules.max_seed_run:
        return "seed_echo"
    if meta_talk(text):
        return "meta_talk"
    if spam_markup(web_markup(text), rules):
        return "web_markup"
    if len(chat_frame_markers(text)) >= rules.max_chat_markers:
        return "chat_frame"
    if hostility(text):
        return "hostile"
    tokens = _tokens(text)
    if (_longest_token_run(tokens) >= rules.max_token_run or _longest_phrase_run(tokens) >= rules.max_phrase_run
            or syllable_loop(text) or doubled_phrase(text, rules.min_doubled_phrase_words)):
        return "repetition_loop"
    stats = text_stats(text)
    if repetitive(stats, rules):
        return "repetitive"
    if not_prose(stats, rules):
        return "not_prose"
    if (fragment_lines(text, rules.fragment_min_lines) > rules.max_fragment_share or article_list(text)
            or short_item_run(text) > rules.max_short_item_run):
        return "fragments"
    if rules.examples and (copies_example(tokens, rules.examples, rules.max_example_run)
                           or borrows_example_name(text, keyphrases, rules.examples)):
        return "copies_example"
    if label is not None and rules.class_names:
        name = dict(rules.class_names).get(str(label))
        if name is not None and opens_with_name(text, name):
            return "names_class"
    if (glossary_headers(text, keyphrases) >= rules.max_glossary_headers
            or markdown_labels(text, keyphrases) >= rules.max_glossary_headers
            or seed_line_labels(text, keyphrases) >= rules.max_seed_line_labels
            or seed_definitions(text, keyphrases) >= rules.max_seed_definitions
            or term_glosses(text) >= rules.max_term_glosses
            or word_glosses(text) >= rules.max_word_glosses
            or quoted_term_glosses(text) >= rules.max_quoted_term_glosses):
        return "glossary"
    if (rules.language is not None and len(tokens) >= rules.language_min_words
            and language_probability(text, rules.language) < rules.min_language_prob):
        return "wrong_language"
    if rules.min_mean_logprob is not None and mean_logprob is not None and mean_logprob < rules.min_mean_logprob:
        return "disfluent"
    if rules.reject_truncated and finish_reason == "length" and not ends_a_sentence(text):
        return "truncated"
    return None


def repetition_score(text: Any, rules: DocumentRules = DEFAULT_RULES) -> float:
    """How repetitive a document is, against the soft thresholds (``rewrite_crowded_word``, ``rewrite_mattr``):
    the larger of the crowded-word count over its threshold and one minus the moving type-token ratio over one
    minus its threshold. 1 or more: worth another candidate (generation keeps the lower score). Not a rejection:
    ``document_rejection`` never reads it. 0 for what is not a text."""
    if not isinstance(text, str) or not text.strip():
        return 0.0
    stats = text_stats(text)
    score = stats.crowded_word / rules.rewrite_crowded_word
    if stats.words >= rules.mattr_min_words:
        score = max(score, (1.0 - stats.mattr) / max(1e-9, 1.0 - rules.rewrite_mattr))
    return float(score)


def rewrite_score(text: Any, keyphrases: Any = (), rules: DocumentRules = DEFAULT_RULES, label: Any = None) -> float:
    """Whether a document is worth another candidate: the largest of ``repetition_score``, the seed terms glossed
    as labels inside the text (``seed_labels``) over ``rewrite_seed_labels``, the longest run of seed terms
    (``longest_seed_run``) over ``rewrite_seed_run``, the words explained as words (``term_glosses``) over
    ``rewrite_term_glosses``, the seed terms explained as words (``seed_glosses``) over ``rewrite_seed_glosses``, and
    the links, tags and chat-frame markers over ``rewrite_links``, ``rewrite_tags``, ``rewrite_chat_markers``; 1
    for a text that opens with its class's public name of two or more words in any case and number
    (``opens_with_name_loosely``; ``label`` is the row's public label, None skips it, as ``rules.class_names``
    empty does). 1 or more: generation asks again (``GenerationParams.max_rewrites``) and keeps the lower score.
    Not a rejection."""
    score = repetition_score(text, rules)
    if isinstance(text, str) and text.strip():
        score = max(score, seed_labels(text, keyphrases) / rules.rewrite_seed_labels,
                    longest_seed_run(text, keyphrases) / rules.rewrite_seed_run,
                    term_glosses(text) / rules.rewrite_term_glosses,
                    seed_glosses(text, keyphrases) / rules.rewrite_seed_glosses)
        markup = web_markup(text)
        score = max(score, markup.links / rules.rewrite_links, markup.tags / rules.rewrite_tags,
                    len(chat_frame_markers(text)) / rules.rewrite_chat_markers)
        name = dict(rules.class_names).get(str(label)) if label is not None else None
        if name is not None and opens_with_name_loosely(text, name):
            score = max(score, 1.0)
    return float(score)


def misused_seed_terms(text: Any, keyphrases: Any, rules: DocumentRules = DEFAULT_RULES) -> tuple[str, ...]:
    """The seed terms ``rewrite_score`` finds misused in ``text``, as given in ``keyphrases`` and in their order:
    glossed as a label ("Suburb: A small town ..."), explained as a word ("Counsel refers to a group of trees") or
    listed in a run of ``rewrite_seed_run`` or more ("is commission, class, gun"). Generation leaves them out of
    the prompt of a later candidate of the same seed (``privseed.tasks.generation.rounds.candidate_request``)."""
    if not isinstance(text, str) or not text.strip():
        return ()
    labelled = seed_label_terms(text, keyphrases)
    named = seed_gloss_terms(text, keyphrases) | seed_run_terms(text, keyphrases, rules.rewrite_seed_run)
    misused: list[str] = []
    for term in keyphrases:
        words = " ".join(_tokens(str(term)))
        if words and (words in named or _singular(words) in labelled) and term not in misused:
            misused.append(term)
    return tuple(misused)


def statistic_over_threshold(text: str, rules: DocumentRules = DEFAULT_RULES) -> str | None:
    """Which measured statistic (``repetitive`` or ``not_prose``) rejects ``text``, by name: for benchmarks and
    for reading why a row was dropped."""
    stats = text_stats(text)
    return repetitive(stats, rules) or not_prose(stats, rules)


def is_document(text: Any, keyphrases: Any = (), finish_reason: str | None = None,
                rules: DocumentRules = DEFAULT_RULES, mean_logprob: float | None = None, label: Any = None) -> bool:
    """True when ``document_rejection`` finds nothing wrong with the text."""
    return document_rejection(text, keyphrases, finish_reason, rules, mean_logprob, label) is None


def rules_from_bounds(bounds: dict[str, Any], rules: DocumentRules | None = None) -> DocumentRules:
    """The document rules with the gate's word bounds (one source for both)."""
    base = rules or DEFAULT_RULES
    return replace(base, min_words=int(bounds["min_words"]), max_words=int(bounds["max_words"]))
