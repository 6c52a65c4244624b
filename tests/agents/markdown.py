"""An agent for the web chat's Markdown test: ``tests.agents.markdown:agent`` replies
with :data:`MARKDOWN`, Markdown of every kind the page renders plus HTML that would run
script (and set ``window.pwned``) if the page ever parsed it."""

from __future__ import annotations

from motus.models import ChatMessage

MARKDOWN = """Here is **the plan** for *today*, with `rm -i` and a snake_case_name.

1. Read the [guide](https://example.com/guide)
2. Skip [this](javascript:window.pwned=3) link

- first point
- second point

```python
print("<b>hi</b>")
```

| file | size | action |
|:-----|-----:|:------:|
| old_logs.txt | 12 KB | **delete** |
| a\\|b.txt | 3 KB | keep |

<script>window.pwned = 1</script><img src="x" onerror="window.pwned = 2">"""


async def agent(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    reply = ChatMessage.assistant_message(content=MARKDOWN)
    return reply, state + [message, reply]
