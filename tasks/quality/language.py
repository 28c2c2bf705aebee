"""Language identification with py3langid (a maintained fork of langid.py, Lui & Baldwin 2012; BSD-3; its
naive Bayes model over byte n-grams ships inside the wheel, so it works offline). Pure: a text in, a probability
out; the model loads once per process (about 3 s) on first use."""

from __future__ import annotations

import functools
import re
from typing import Any

# Wikipedia abstracts gloss a name in its own script: "Maria Kirova (Bulgarian: Мария Кирова) is a ... singer".
# The gloss says nothing about the language the text is written in, so bracketed spans are left out.
_BRACKETED = re.compile(r"\([^()]*\)|\[[^\[\]]*\]")


@functools.lru_cache(maxsize=1)
def _identifier() -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


#: The ISO 639 codes the identifier's model knows (py3langid 0.4.0; tests/test_quality.py checks the list against the
#: model), the values ``--language`` accepts. Written out so that checking a configuration does not load the model.
LANGUAGES: frozenset[str] = frozenset(
    "ace af am an ar ary arz as az ba bcl be bg bn br bs ca crh cs cy da de dz el en eo es et eu ext fa fi fo fr fuv "
    "fy ga gcf gcr gd gl gom grc gu gug guw ha hbo he hi hr ht hu hy id ig is it ja jv ka kab kik kk km kn ko ku ky "
    "la lb lg lij ln lo lt ltg lv mg mk ml mn mr ms mt my ne nl nn no nso oc om or pa pcm pl ps pt qu ro ru rw sa "
    "sdh se si sk sl sn so sq sr st sv sw ta te tg th tk tl tr tt ug uk ur uz uzs vec vi vo wa wuu xh yo yue zh zu "
    "zxx".split())


def model_languages() -> frozenset[str]:
    """The languages of the loaded model (loads it)."""
    return frozenset(_identifier().nb_classes)


def language_probability(text: str, language: str) -> float:
    """The identifier's probability (normalised over the languages it knows) that ``text`` is in ``language``."""
    ranked = _identifier().rank(_BRACKETED.sub(" ", text))
    return float(dict(ranked).get(language, 0.0))
