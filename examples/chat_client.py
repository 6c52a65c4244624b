"""A whole human-in-the-loop turn in plain ``requests``: a template for your own frontend.

    python examples/chat_client.py http://localhost:8000 "delete the old logs file"

Create a session, send the message, long poll, answer each pending interrupt from the
terminal, and print the reply. ``motus serve chat`` does the same with more care.
"""

import json
import sys

import requests

url, text = sys.argv[1].rstrip("/"), sys.argv[2]
session = requests.post(f"{url}/sessions", json={}, timeout=10).json()["session_id"]


def answer(interrupt):
    payload = interrupt["payload"]
    if interrupt["type"] == "tool_approval":
        print(f"Run {payload['tool_name']} with {json.dumps(payload.get('tool_args'))}?")
        return {"approved": input("Approve? [y/N] ").strip().lower() == "y"}
    if interrupt["type"] == "user_input":
        answers = {}
        for q in payload["questions"]:
            labels = [option["label"] for option in q["options"]]
            print(f"[{q['header']}] {q['question']}")
            for number, label in enumerate([*labels, "Other: type your own answer"], start=1):
                print(f"  {number}. {label}")
            picks = [int(n) for n in input("Choice: ").replace(",", " ").split()]
            chosen = [labels[n - 1] if n <= len(labels) else input("Your answer: ") for n in picks]
            answers[q["question"]] = ", ".join(chosen)
        return {"answers": answers}
    # Any other type is the agent's own: show its words and payload, take JSON or plain text.
    print(f"[{interrupt['type']}] {payload.get('title') or payload.get('prompt') or 'The agent is waiting.'}")
    print(json.dumps(payload, indent=2))
    text = input("Your answer (JSON, or plain text): ")
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON: sent as a string


try:
    requests.post(f"{url}/sessions/{session}/messages", json={"content": text}, timeout=10).raise_for_status()
    while True:
        # Long poll: the server answers as soon as the status changes, or after 30 s.
        state = requests.get(f"{url}/sessions/{session}", params={"wait": "true", "timeout": 30}, timeout=40)
        state.raise_for_status()
        state = state.json()
        if state["status"] == "idle":
            print(state["response"]["content"])
            break
        if state["status"] == "error":
            sys.exit(f"Error: {state['error']}")
        for interrupt in state["interrupts"] or []:  # every pending one, each exactly once
            body = {"interrupt_id": interrupt["interrupt_id"], "value": answer(interrupt)}
            requests.post(f"{url}/sessions/{session}/resume", json=body, timeout=10)
finally:
    requests.delete(f"{url}/sessions/{session}", timeout=10)
