"""The text a browser would show of an EDGAR filing's HTML (``storage.formats.sec.html_paragraphs``).

A filing's main document is HTML, often inline XBRL; only what a reader sees becomes sentences, one
paragraph per block element. What is hidden (scripts, styles, the XBRL header, anything styled
``display:none``) must never enter a dataset: it is not the filer's prose, and a hidden region that leaked
would put machine tags and numbers in the training text.
"""

from __future__ import annotations

from uedp.storage.formats.sec import html_paragraphs


def test_block_elements_make_paragraphs_and_inline_ones_do_not() -> None:
    markup = ("<html><body><p>Risk factors are <b>many</b> and <i>varied</i>.</p>"
              "<div>Our revenue<br>fell.</div><ul><li>One</li><li>Two</li></ul></body></html>")
    assert html_paragraphs(markup) == ["Risk factors are many and varied.", "Our revenue", "fell.", "One", "Two"]


def test_scripts_styles_the_head_and_the_xbrl_header_are_hidden() -> None:
    markup = ("<html><head><title>10-K</title><style>p {color: red}</style></head><body>"
              "<script>var secret = 'not prose';</script>"
              "<ix:header><ix:hidden>dei:EntityCentralIndexKey 0000320193</ix:hidden></ix:header>"
              "<p>The visible sentence.</p></body></html>")
    assert html_paragraphs(markup) == ["The visible sentence."]


def test_a_region_styled_display_none_is_hidden_to_its_matching_end_tag_counting_nested_ones() -> None:
    markup = ('<div style="display: none"><div>hidden one</div><div>hidden two</div></div>'
              '<div>shown after</div><span style="DISPLAY:NONE">hidden span</span><p>shown too</p>')
    assert html_paragraphs(markup) == ["shown after", "shown too"]


def test_a_void_element_styled_hidden_does_not_hide_what_follows() -> None:
    """An <img> or <br> has no end tag: treating it as opening a hidden region would hide the rest."""
    markup = '<p>Before<br style="display:none">after</p><img style="display:none" src="x.png"><p>Last.</p>'
    assert html_paragraphs(markup) == ["Before", "after", "Last."]


def test_entities_are_decoded_and_whitespace_collapsed() -> None:
    markup = "<p>Smith&nbsp;&amp;&nbsp;Sons\n   paid&#160;$3,000 &lt;net&gt;.</p>"
    assert html_paragraphs(markup) == ["Smith & Sons paid $3,000 <net>."]


def test_table_cells_are_paragraphs_of_their_own() -> None:
    markup = "<table><tr><td>Revenue</td><td>$1,200</td></tr><tr><td>Costs</td><td>$800</td></tr></table>"
    assert html_paragraphs(markup) == ["Revenue", "$1,200", "Costs", "$800"]


def test_markup_without_visible_text_gives_no_paragraphs() -> None:
    assert html_paragraphs("") == []
    assert html_paragraphs("<html><head><script>x()</script></head><body><div>  </div></body></html>") == []


def test_unclosed_and_stray_tags_do_not_lose_text() -> None:
    markup = "<p>First paragraph<p>Second paragraph</div></span>Tail text"
    assert html_paragraphs(markup) == ["First paragraph", "Second paragraph", "Tail text"]
