"""The measured statistics of the document predicate (Gopher quality and repetition, MATTR, language
identification, fluency) and the data file of its remaining patterns."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from privseed.tasks.errors import ConfigError
from privseed.tasks.quality import (DEFAULT_RULES, LANGUAGES, META_TALK_PATTERNS, TUNABLE_RULES, DocumentRules,
                                    derive_quality_columns, document_rejection, language_probability,
                                    misused_seed_terms, repetition_score, rewrite_score, statistic_over_threshold,
                                    text_stats)
from privseed.tasks.quality.language import model_languages
from privseed.tasks.quality.patterns import PATTERNS_FILE, chat_frame_markers
from privseed.tasks.quality.shapes import (WebMarkup, longest_seed_run, seed_glosses, seed_labels, term_glosses,
                                           web_markup, word_glosses)
from privseed.tasks.quality.text_stats import (crowded_word_count, duplicate_ngram_char_fraction,
                                               moving_type_token_ratio, top_ngram_char_fraction)

PROSE = ("The river rises in the northern hills and flows past the village of Tarvola, where its banks were first "
         "settled by farmers in the twelfth century. A stone bridge built in 1820 carries the old coach road over "
         "it, and a mill that once ground the corn of three parishes still stands beside the weir.")


def test_gopher_repetition_fractions_follow_the_published_definitions():
    # Top n-gram: characters of the most frequent n-gram times its count, over the text's length.
    words = "a b a b a b c".split()
    assert top_ngram_char_fraction(words, 2, 100) == pytest.approx(3 * 3 / 100)  # "a b" three times
    assert top_ngram_char_fraction("a b c d".split(), 2, 100) == 0.0  # nothing repeats
    # Duplicated n-grams: counted after their first occurrence, without overlap, characters joined without spaces.
    assert duplicate_ngram_char_fraction("x y x y x y".split(), 2, 12) == pytest.approx(4 / 12)
    stats = text_stats("one line\nother line\none line\none line")
    assert stats.dup_line_frac == pytest.approx(2 / 4)
    assert stats.dup_line_char_frac == pytest.approx(16 / len("one line\nother line\none line\none line"))
    assert text_stats("Para one.\n\nPara one.\n\nPara two.").dup_para_frac == pytest.approx(1 / 3)


def test_gopher_quality_statistics():
    stats = text_stats(PROSE)
    assert stats.stop_words >= 4 and stats.alpha_word_frac > 0.9 and 3 < stats.mean_word_length < 10
    assert stats.symbol_word_ratio == 0.0 and stats.mattr > 0.7
    assert text_stats("#tag #tag #tag word word").symbol_word_ratio == pytest.approx(3 / 5)
    # Markdown headings are layout, not symbols: "## Career" adds nothing.
    assert text_stats("## Career\nHe played for the club.").symbol_word_ratio == 0.0
    assert text_stats("- a\n- b\n- c").bullet_line_frac == 1.0
    assert text_stats("Singer, Hammy, Drying, Rooftop, Rowling, Ctf. A band.").capital_list_chars > 0.5
    assert text_stats("the RomanAdministrativeAdministrative robertrobertro soooooooo").doubled_groups == 2


def test_mattr_is_the_mean_share_of_new_words_per_window():
    assert moving_type_token_ratio(list("abcd")) == 1.0
    assert moving_type_token_ratio(list("abab"), window=2) == 1.0
    assert moving_type_token_ratio(list("aaab"), window=2) == pytest.approx((1 + 1 + 2) / 3 / 2)


def test_crowded_word_counts_one_content_word_within_a_window():
    words = "the football club and football clubs of the town play football".split()
    assert crowded_word_count(words) == 3  # "clubs" counts as "club", "football" three times
    assert crowded_word_count(["the"] * 10 + ["of"] * 10) == 0  # stop words and short words do not count
    spread = (["river"] + ["x%d" % i for i in range(45)]) * 3
    assert crowded_word_count(spread) == 1 and crowded_word_count(spread, window=100) == 3


def test_a_repetitive_document_scores_one_or_more_and_is_not_rejected_for_it():
    loop = ("Football is played on a football field, and the football is played by a football player. Football is "
            "also played in the football stadium, and football is played in football stadiums.")
    assert repetition_score(loop) >= 1.0 and repetition_score(PROSE) < 0.5
    assert document_rejection(loop) is None  # soft: generation asks for another candidate, the gate keeps it
    assert repetition_score(loop, DocumentRules(rewrite_crowded_word=9, rewrite_mattr=0.3)) < 1.0
    assert repetition_score(None) == 0.0
    with pytest.raises(ConfigError):
        DocumentRules(rewrite_crowded_word=1)
    assert DEFAULT_RULES.with_settings({"rewrite_mattr": "0.6"}).rewrite_mattr == 0.6


def test_a_document_that_circles_without_a_crowded_word_scores_one_or_more():
    # make demo, 2026-11-27: no word six times in forty, but a type-token ratio of 0.51 (real text: 0.55 or less
    # in at most 0.06 % of any public corpus).
    circling = ("The River of the North, a tributary of the South, is located on the South-West of the Central, and "
                "is a natural place that is known for its beauty and beauty. It is a natural wonder that is known to "
                "many people around the world. The range of the North-South is a natural beauty that is known as the "
                "Southwest. The North-South, a natural place, is a natural thing that is known. It is known as Lasts. "
                "The North, South, and East are the four Maguire Mountains.")
    assert text_stats(circling).crowded_word < DEFAULT_RULES.rewrite_crowded_word
    assert repetition_score(circling) >= 1.0 and document_rejection(circling) is None


def test_a_seed_glossed_as_a_label_asks_for_another_candidate_without_being_rejected():
    # make demo, 2026-11-27, at the default repeat penalty: four of twenty rows glossed a seed this way.
    text = ("The University of Victoria, a premier academic institution in Canada, opened its doors to the public in "
            "1895. Suburb: A small town or valley is a smaller part of a larger area that has junior standing.")
    seed = ["valley", "university", "suburb", "opened", "school"]
    assert seed_labels(text, seed) == 1 and rewrite_score(text, seed) >= 1.0
    assert document_rejection(text, seed) is None and repetition_score(text) < 1.0
    # a title's colon at the start, a structured abstract's capitals, a label that is not a seed term: not counted
    assert seed_labels("Mulan: Rise of a Warrior is a 2009 film. It was shot in China.", ["mulan"]) == 0
    assert seed_labels("A trial of aspirin. OBJECTIVE: To compare two doses.", ["objective"]) == 0
    assert seed_labels("We ate well. Pros: the soup. Cons: the noise.", ["soup"]) == 0
    assert seed_labels("We ate well. Soup: hot and good.", ["soup"]) == 1
    assert seed_labels("We ate well.\n2. Soup: hot and good.", ["soup"]) == 1
    assert rewrite_score(text, seed, DocumentRules(rewrite_seed_labels=2)) < 1.0
    with pytest.raises(ConfigError):
        DocumentRules(rewrite_seed_labels=0)


def test_a_seed_stuffed_tagged_or_explained_inside_a_sentence_asks_for_another_candidate():
    # Three rows of the fresh-clone demo of 2dc13ba (2026-11-27) that failed the twenty-row reading and passed
    # every rewrite test of the day.
    listed = ("The Art of London is a musical genre that originated in andrew, john, born, best. It has since become "
              "one of the most successful music genres around the world.")
    listed_seed = ["andrew", "john", "born", "best", "music", "london", "barry"]
    tagged = ("France was once again founded as a Christian nation with its own culture, including literature, music, "
              "art, architecture, fashion, cuisine, Imprint: French Reviewed in 201 agree.")
    tagged_seed = ["france", "fantasy", "imprint", "reviewed", "agree"]
    explained = ("The interview with him by the public broadcaster has become an iconic moment. july is another term "
                 "used when referring to abdul, which refers to his wife.")
    explained_seed = ["july", "abdul", "born", "politician"]
    for text, seed in ((listed, listed_seed), (tagged, tagged_seed), (explained, explained_seed)):
        assert rewrite_score(text, seed) >= 1.0 and document_rejection(text, seed) is None
        assert repetition_score(text) < 1.0
    assert seed_labels(tagged, tagged_seed) == 1
    # A lowercase word before the colon is a list or a pronunciation, and two seeds in a list are prose.
    assert seed_labels("It has offices in 10 cities: Milan, London.", ["cities"]) == 0
    assert seed_labels("Banco Popular (Spanish pronunciation: [ba]) is a bank.", ["pronunciation"]) == 0
    assert rewrite_score("We had soup and bread by the window.", ["soup", "bread", "window"]) < 1.0
    assert rewrite_score(listed, listed_seed, DocumentRules(rewrite_seed_run=5)) < 1.0
    with pytest.raises(ConfigError):
        DocumentRules(rewrite_seed_run=0)


def test_words_glossed_one_after_another_inside_prose_are_a_glossary():
    # An OHSUMED-23 row of 2026-11-27 (20 a class, example abstracts): no sentence opens with a seed, yet three
    # content words are explained in one sentence.
    glossed = ("The major of a disease is the one that has been identified as a primary cause, growth refers to the "
               "development and maturation process, hypothesis pertains to an idea or theory being tested for "
               "validity, site denotes a specific location where research was conducted.")
    assert word_glosses(glossed) == 3 and document_rejection(glossed, ["growth", "hypothesis"]) == "glossary"
    # Once is prose, and so are stop words ("This refers to", "which denotes"): real abstracts say both.
    assert word_glosses("The term PTCA refers to coronary angioplasty. This refers to the first week.") == 1
    assert word_glosses("This refers to the work, which denotes the rest.") == 0
    # A seed explained as "a <two words> term used by ..." (fresh-clone demo of cf1676a): a reason to ask again.
    sports = "York is a popular sports term used by fans around the world as it refers to England in particular."
    assert term_glosses(sports) == 1 and rewrite_score(sports, ["york", "july"]) >= 1.0
    assert document_rejection(PROSE + " Grade refers to the size of the tumour.", ["river"], "stop") is None


def test_a_seed_explained_as_a_word_asks_again_and_prose_that_names_or_means_does_not():
    # Rows of the demo release of 2026-11-27 (demo seeds, SmolLM2): a seed the model could not place, explained.
    named = ('The Office Holder is a cabinet member. He was appointed in April 2017. The name "Pronunciation" refers '
             'to the British English accent called "p-r-n-u-s".')
    seed = ["called", "april", "physician", "cabinet", "pronunciation"]
    assert seed_glosses(named, seed) == 1 and rewrite_score(named, seed) >= 1.0
    assert document_rejection(named, seed, "stop") is None  # a reason to ask again, never a rejection
    assert seed_glosses("It is also known as war, which means \"the sea\" or \"manga.\"", ["war", "manga"]) == 1
    assert seed_glosses("Uss, also known as January, is an abbreviation for \"chief\".", ["uss", "chief"]) == 1
    assert seed_glosses("Counsel refers to a group of trees known for their medicinal properties.", ["counsel"]) == 1
    # Prose: "means" as a noun or in "by all means", a name given with "referred to as", a gloss of no seed term.
    assert seed_glosses("It aims to create new means of human transportation.", ["new", "transportation"]) == 0
    assert seed_glosses("It is not a fancy place by any means, but the pizza is good.", ["fancy", "place"]) == 0
    assert seed_glosses("Fuze, commercially referred to as simply Fuze, makes teas.", ["commercially", "fuze"]) == 0
    assert seed_glosses("The liner is a type of early aircraft.", ["liner", "early"]) == 0
    assert seed_glosses("PTCA refers to coronary angioplasty.", ["river"]) == 0
    assert rewrite_score(named, seed, DocumentRules(rewrite_seed_glosses=2)) < 1.0
    with pytest.raises(ConfigError):
        DocumentRules(rewrite_seed_glosses=0)


def test_misused_seed_terms_are_the_ones_a_rewrite_is_asked_for_as_given_in_the_seed():
    # The demo release of 2026-11-27: a run of seeds, a seed explained, a seed as a label; the seed's own spelling.
    seed = ["Commission", "class", "gun", "navy", "april", "allies", "sea bird"]
    text = ("The means of transportation is commission, class, gun. It served the navy. A fun fact is april which "
            "means \u201cfantastic\u201d in Turkish. Allies: insects that live by the sea. Sea birds nest there.")
    assert misused_seed_terms(text, seed) == ("Commission", "class", "gun", "april", "allies")
    assert misused_seed_terms(text, seed, DocumentRules(rewrite_seed_run=4)) == ("april", "allies")
    assert misused_seed_terms(PROSE, ["river", "village"]) == () and misused_seed_terms(None, seed) == ()


def test_seed_months_stuffed_into_dates_are_a_seed_run_and_a_real_date_range_is_not():
    # The fresh-clone demo of 843f3ab (2026-11-27): three seed months and a seed name joined by dates and commas.
    stuffed = "His latest album came out in Spain. October 13th is September 2017, January 2024, kim's birthday."
    seed = ["music", "january", "september", "documentation", "director", "october", "better", "kim"]
    assert longest_seed_run(stuffed, seed) == 3 and rewrite_score(stuffed, seed) >= 1.0
    # A DBPedia-14 life span: the year after the comma is a word of its own and breaks the run.
    assert longest_seed_run("Ann Lee (January 5, 1950 - October 3, 2010) was a poet.", ["january", "october"]) == 1
    assert longest_seed_run("Between October 1985 and March 1988, 95 patients entered.", ["october", "march"]) == 2


def test_each_statistic_rejects_its_shape_and_prose_passes():
    assert statistic_over_threshold(PROSE) is None and document_rejection(PROSE, ["river"], "stop") is None
    genus = ("The genus of the group of animals known as the family of the group known as the group of the small "
             "group of animals. The group described is known as the large group of the group.")
    assert statistic_over_threshold(genus) == "mattr"
    assert document_rejection(genus, ["genus"], "stop") == "repetitive"
    hashtags = ("Great match tonight at the stadium with friends and family #football #derby #goals #win #city "
                "#fans #matchday #league #cup #team #season")
    assert statistic_over_threshold(hashtags) == "symbol_word_ratio"
    years = "Years of the fair: " + " ".join(str(y) for y in range(1990, 2010)) + " and after that none."
    assert statistic_over_threshold(years) == "alpha_word_frac"
    assert statistic_over_threshold(years[:60]) is None  # too short for the Gopher quality statistics
    nouns = ("river bridge market church mill village road tower stone weir farm parish corn hills coach field lane "
             "gate orchard barn well yard green pond abbey castle harbour quay wharf forge smithy chapel rectory manor "
             "meadow copse brook ford spring moor heath lake island forest valley glen cliff cave beach shore bay")
    assert statistic_over_threshold(nouns) == "stop_words"


def test_language_is_identified_by_a_maintained_model():
    assert LANGUAGES == model_languages()  # the written-out list is the model's
    spanish = "El río nace en las montañas del norte y desemboca en el mar después de pasar por la ciudad."
    assert language_probability(spanish, "es") > 0.9 > language_probability(spanish, "en")
    # A name glossed in its own script does not make an English abstract foreign.
    bulgarian_name = ("Maria Panayotova Kirova (Bulgarian: Мария Панайотова Кирова) (born January 13 1982) best known "
                      "as Maria is a Bulgarian pop-folk singer who has released six albums.")
    assert document_rejection(bulgarian_name, ["singer"], "stop") is None
    assert document_rejection(spanish, ["river"], "stop") == "wrong_language"
    assert document_rejection(spanish, ["river"], "stop", DocumentRules(language="es")) is None
    with pytest.raises(ConfigError):
        DocumentRules(language="xx")


def test_fluency_is_tested_only_when_the_backend_reports_it_and_the_owner_sets_a_bar():
    rules = DEFAULT_RULES.with_settings({"min_mean_logprob": "-2.5"})
    assert rules.min_mean_logprob == -2.5
    assert document_rejection(PROSE, ["river"], "stop", rules, mean_logprob=-3.1) == "disfluent"
    assert document_rejection(PROSE, ["river"], "stop", rules, mean_logprob=-1.2) is None
    assert document_rejection(PROSE, ["river"], "stop", rules) is None  # absent: skipped
    assert document_rejection(PROSE, ["river"], "stop", mean_logprob=-9.0) is None  # default: no bar
    assert DEFAULT_RULES.with_settings({"min_mean_logprob": "none"}).min_mean_logprob is None
    frame = pd.DataFrame({"text": [PROSE, PROSE], "keyphrases": [["river"], ["river"]], "label": [0, 0],
                          "mean_logprob": [-3.1, None]})
    reasons = derive_quality_columns(frame, rules)["q_document_reason"]
    assert reasons[0] == "disfluent" and pd.isna(reasons[1])


def test_document_rule_settings_take_the_new_threshold_names():
    rules = DEFAULT_RULES.with_settings({"max_top_2gram_char_frac": "0.4", "min_stop_words": "0", "min_mattr": 0.3})
    assert (rules.max_top_2gram_char_frac, rules.min_stop_words, rules.min_mattr) == (0.4, 0, 0.3)
    assert {"min_mattr", "max_dup_5gram_char_frac", "min_language_prob", "min_mean_logprob"} <= set(TUNABLE_RULES)
    for bad in ({"min_distinct_2": "0.5"}, {"min_stop_words": "1.5"}, {"max_top_2gram_char_frac": "2"},
                {"max_symbol_word_ratio": "none"}):
        with pytest.raises(ConfigError):
            DEFAULT_RULES.with_settings(bad)


def test_patterns_live_in_a_data_file_each_with_its_reason():
    data = json.loads(PATTERNS_FILE.read_text(encoding="utf-8"))
    groups = data["meta_talk"]
    assert all(g["why"] and g["patterns"] for g in groups)
    assert len(META_TALK_PATTERNS) == sum(len(g["patterns"]) for g in groups)
    assert all(entry["name"] and entry["pattern"] for entry in data["template_residue"])


def test_a_terse_review_in_sentences_is_not_its_seed_list_given_back():
    seeds = ["lousy", "mexican", "food", "try", "casa", "borrega", "instead"]
    assert document_rejection("Lousy Mexican food. Try Casa Borrega instead.", seeds, "stop") is None
    assert document_rejection("lousy, mexican, food, try, casa, borrega, instead", seeds, "stop") == "seed_echo"
    assert document_rejection("Lousy Mexican food try Casa Borrega instead.", seeds, "stop") == "seed_echo"


# ---------------------------------------------------------------------------------------------------------------
# Issue 48: links, tags and the chat frame. A real post or review may carry one link, a hashtag or a greeting, so one
# asks for another candidate (rewrite_score) and only what real texts rarely have is rejected.
# ---------------------------------------------------------------------------------------------------------------
REVIEW = ("We came for the brunch and stayed for the coffee. The pancakes were light and the staff friendly, "
          "though the wait on a Sunday was long.")


def test_web_markup_counts_links_and_tags_and_leaves_names_and_numbers_alone():
    text = "See http://www.example-news.com/a and mail bob@example.org about #travel or @bob."
    markup = web_markup(text)
    assert (markup.links, markup.tags, markup.opens_with_link) == (2, 2, False)
    links = len("http://www.example-news.com/a") + len("bob@example.org")
    assert markup.link_share == pytest.approx(links / len(text.replace(" ", "")))
    # A bare domain is a company's name (DBPedia-14's "Kayak.com"); "#1", "C#", "&#39;" and an address are no tags.
    assert web_markup("Kayak.com is a travel site; it ranked #1 and its code is C# and &#39; too.") == WebMarkup()
    assert web_markup("www.deals4u.net/sale Get the best prices now.").opens_with_link


@pytest.mark.parametrize("tail, reason", [
    ("", None),
    (" Photos: http://www.example-brunch.com/photos", None),  # one link: a real review's
    (" #brunch #sunday", None),  # two hashtags: a tweet's
    (" #brunch #sunday #coffee", "web_markup"),
    (" http://a-deals.com/1 http://b-deals.com/2 or mail deals@c-deals.com", "web_markup"),
])
def test_links_and_tags_reject_only_what_real_texts_rarely_have(tail, reason):
    text = REVIEW + tail
    assert document_rejection(text, ["brunch", "coffee"], "stop") == reason
    assert (rewrite_score(text, ["brunch", "coffee"]) >= 1.0) == bool(tail)


def test_a_text_that_opens_with_a_link_or_is_mostly_links_is_web_markup():
    assert document_rejection("http://www.nakednews-tv.com/en-us/ " + REVIEW, [], "stop") == "web_markup"
    mostly = "Read the whole story here: https://www.market-news-today.com/articles/2024/03/stocks-rally-into-spring"
    assert web_markup(mostly).link_share >= DEFAULT_RULES.max_link_share
    assert document_rejection(mostly, [], "stop") == "web_markup"
    relaxed = DocumentRules(reject_opening_link=False, max_link_share=1.0, max_tags=4)
    assert document_rejection("http://www.nakednews-tv.com/en-us/ " + REVIEW, [], "stop", relaxed) is None
    assert document_rejection(REVIEW + " #brunch #sunday #coffee", [], "stop", relaxed) is None
    assert rewrite_score(REVIEW + " #brunch", [], DocumentRules(rewrite_tags=2)) < 1.0
    # The owner sets them by name (--document-rule), and none may be below one.
    settings = {"reject_opening_link": "no", "max_link_share": "1", "max_tags": "4"}
    assert DEFAULT_RULES.with_settings(settings) == relaxed
    for bad in (dict(max_links=0), dict(max_tags=0), dict(rewrite_chat_markers=0), dict(max_link_share=1.5)):
        with pytest.raises(ConfigError):
            DocumentRules(**bad)


@pytest.mark.parametrize("text, markers", [
    ("Hi folks, " + REVIEW, ("greeting to a crowd",)),
    (REVIEW + "\nCheers,\nMike", ("sign-off",)),
    ("Hey everyone,\nWanted to share a fantastic article on the market. " + REVIEW,
     ("greeting to a crowd", "writing to share")),
    ("Hello all,\nI hope this message finds you well! " + REVIEW, ("greeting to a crowd", "hope this finds you well")),
    (REVIEW + " Let me know what you think!\nBest regards,\nAnna", ("invitation to reply", "sign-off")),
    # An assistant's apology opening the text (7 % of a yelp-stars release; 4 of 10,000 real reviews): a rewrite.
    ("I'm sorry, just. I was asked to give 3 stars. " + REVIEW, ("apology opening",)),
    ("I\u2019m so sorry to say, but today was not a good day for me. " + REVIEW, ("apology opening",)),
    ("Sorry, but " + REVIEW + "\nCheers,\nMike", ("apology opening", "sign-off")),
    # An assistant's cheer opening the text (9 % of a yelp-stars release; 3 of 10,000 real reviews): a rewrite.
    ("I'm so glad to say that I've had the pleasure of visiting a place called the Palace. " + REVIEW,
     ("glad opening",)),
    ("I am thrilled to announce my new favourite brunch. " + REVIEW + "\nCheers,\nMike", ("glad opening", "sign-off")),
    # The reply's own voice (2 of 100 rows of two yelp-stars releases; no real text opens so): a rewrite.
    ("I'm glad to hear that the meal was upscale, but the service was slow. " + REVIEW, ("glad opening",)),
    ("I'm glad I could help you, bartender. " + REVIEW, ("glad opening",)),
    # The review judged instead of written (9-10 % of two yelp-stars releases): a rewrite.
    ("The review was glowing, but I thought it could be even better. " + REVIEW, ("the review judged",)),
    ("I'm sorry. The review is quite good, but the first two sentences made a difference.", ("apology opening",)),
    ("The review is quite good, and I appreciate all the kind words.\nThanks,\nThe owner", ("the review judged",
                                                                                          "sign-off")),
    # A greeting inside the text, "regards" in mid-sentence and "thanks" that is not a line's close are prose.
    ("He said hello everyone at the door. With regards to the wait, thanks to the staff it was short.", ()),
    ("The waiter said he was sorry, but the kitchen had closed. We are sorry we came so late.", ()),
    # A review that says what it covers, or another review read before the visit, is a review.
    ("This review is for the burgers only. We came on a Sunday and the fries were hot and salty.", ()),
    ("I'm glad we went early: the brunch line was short and the eggs were hot.", ()),
    ("I'm glad I stayed despite the reviews. The bed was comfortable and the pool was clean.", ()),
    ("My review is based on the service alone: the host was rude and the table was not ready.", ()),
    ("I read one review before we went. The review was right about the cold fries and the noise.", ()),
])
def test_chat_frame_markers_are_named_and_two_of_them_are_a_chat_frame(text, markers):
    assert chat_frame_markers(text) == markers
    assert (document_rejection(text, [], "stop") == "chat_frame") == (len(markers) >= DEFAULT_RULES.max_chat_markers)
    assert (rewrite_score(text, []) >= 1.0) == bool(markers)


@pytest.mark.parametrize("text, talks", [
    ("The following is a Usenet newsgroup post:\nMy tv set died last night and I need a new one soon.", True),
    ("Below is a short forum post about the tv set:\nMy tv set died last night and I need a new one soon.", True),
    ("Here's a possible reply to the thread. My tv set died last night and I need a new one soon.", True),
    ("I'm glad you're excited about news. I have done this job for a long time and I like it.", True),
    ("I'm so glad you took the time to speak with me. The staff at the desk were friendly.", True),
    ("I'm sorry for your trouble. The store has had some problems recently with its furniture.", True),
    ("I am sorry to hear about your stay. The rooms were clean but the lift was broken.", True),
    ("Welcome to the group. Chatbot or AI designed to help with news and the weather.", True),
    # A review that opens "Here is a review", a colon inside a line, a reply glad about something later on.
    ("Here is a review of the diner on Main Street. The pancakes were great and the coffee hot.", False),
    ("This is my review: the pancakes were great and the coffee was hot, so we will return.", False),
    ("Thanks for the tip on the set. I'm glad you're enjoying the new one, it was a good buy.", False),
    # A review glad or sorry about its own visit: not the requester answered.
    ("I'm so glad I found this salon. The stylist listened and the cut has held up for weeks.", False),
    ("I'm sorry to say the soup was cold, but the staff took it back without a fuss.", False),
    # The assistant's apology for what it cannot do, at the start; a reviewer who does not get the place is a review.
    ("I'm sorry, I don't have any additional information about the restaurant. The food was good.", True),
    ("I'm so sorry, I can't do that for you. Loved my last day at the shop all the same.", True),
    ("I'm sorry, but I don't get this place at all! It's way too expensive for what it is.", False),
    ("I'm sorry to say I was not able to finish the soup; it was far too salty for me.", False),
])
def test_talk_about_the_post_is_meta_talk_and_a_review_that_says_here_is_stays(text, talks):
    assert (document_rejection(text, [], "stop") == "meta_talk") == talks
