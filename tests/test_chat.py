"""The runtime's chat-template rendering agrees with transformers' apply_chat_template."""

import pytest

import tiny_models as tm
from specedge.errors import BundleError
from specedge.runtime.chat import render_chat

TEMPLATE = ("{%- if messages[0]['role'] != 'system' %}{{ bos_token }}<|im_start|>system\nBe brief.<|im_end|>\n"
            "{%- endif %}\n{%- for m in messages %}\n<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}"
            "<|im_end|>\n{%- endfor %}\n{%- if add_generation_prompt %}\n<|im_start|>assistant\n{%- endif %}")


@pytest.mark.parametrize("template", [tm.CHAT_TEMPLATE, TEMPLATE])
def test_render_matches_transformers(template):
    tok = tm.byte_tokenizer(chat=True)
    tok.chat_template = template
    messages = [{"role": "user", "content": "  hello ✓ "}]
    expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render_chat(template, messages, tok.bos_token, tok.eos_token) == expected


def test_template_errors_are_bundle_errors():
    with pytest.raises(BundleError, match="chat template failed: no system"):
        render_chat("{{ raise_exception('no system') }}", [], None, None)


def _lines(*lines):
    it = iter(lines)

    def read():
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return read


def test_chat_messages_span_lines_between_triple_quotes_or_after_a_backslash():
    from specedge.chat_repl import read_message

    read = _lines('"""', "def f():", "", "    return 1", '"""', "first \\", "second", "alone", '"""', "unclosed")
    assert read_message(read) == "def f():\n\n    return 1"           # pasted code, blank line and all
    assert read_message(read) == "first \nsecond"
    assert read_message(read) == "alone"
    assert read_message(read) == "unclosed"                          # EOF ends an open block
    with pytest.raises(EOFError):
        read_message(read)
