"""An agent loop of one's own over fork sessions: a calculator agent whose tree is
grown by the client, forking at every step boundary, so each branch continues from
its parent's cached KV instead of re-sending (and recomputing) the whole prefix.

    python fork_agent_example.py [BASE_URL] [QUESTION]

Each step: fork the node into WIDTH branches, let each write until `</calc>` or
`</answer>`, run the calculator on a `<calc>` call and append its result as the
observation, then go on from the branches that called it. Prints every leaf and the
tokens the server reused instead of computing.
"""

import re
import sys

from treegrpo_client import Client

SYSTEM = (
    "Solve the arithmetic problem. To compute, write <calc>expression</calc> and wait "
    "for the result. End with <answer>number</answer>."
)
WIDTH, DEPTH, STEP_TOKENS = 2, 2, 48


def calculator(text: str):
    """The tool: evaluates the last `<calc>` call (digits and + - * / ( ) . only)."""
    calls = re.findall(r"<calc>([^<]*)", text)
    if not calls or not re.fullmatch(r"[\d\s+\-*/().]+", calls[-1]):
        return None
    try:
        return eval(calls[-1], {"__builtins__": {}})  # the pattern above admits arithmetic only
    except (SyntaxError, ZeroDivisionError):
        return "error"


def metric(text: str, name: str) -> float:
    return next(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " "))


def main() -> None:
    base_url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
    question = sys.argv[2] if len(sys.argv) > 2 else "What is 17 * 23 + 4?"
    client = Client(base_url)
    reused_before = metric(client.metrics(), "treegrpo_tokens_reused_fork_total")
    root = client.session(messages=[{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": question}])
    frontier, leaves = [(root, [])], []
    for depth in range(DEPTH):
        grown = []
        for node, path in frontier:
            for branch in node.fork(WIDTH):
                out = branch.generate(max_new_tokens=STEP_TOKENS, temperature=1.0,
                                      stop=["</calc>", "</answer>"])
                result = calculator(out["text"])
                steps = path + [out["text"]]
                if result is None or depth == DEPTH - 1:
                    leaves.append(steps)
                    branch.close()
                else:
                    branch.append(text=f"</calc>\n<result>{result}</result>\n")
                    grown.append((branch, steps + [f"<result>{result}</result>"]))
            node.close()
        frontier = grown
    for node, path in frontier:
        node.close()
    for i, steps in enumerate(leaves):
        print(f"leaf {i}: " + " | ".join(s.strip().replace("\n", " ") for s in steps))
    reused = metric(client.metrics(), "treegrpo_tokens_reused_fork_total") - reused_before
    print(f"{len(leaves)} leaves; {reused:.0f} prefix tokens reused by forks instead of recomputed")


if __name__ == "__main__":
    main()
