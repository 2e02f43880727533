// vLLM's Anthropic server, left at its default ("auto"), decides once which reasoning_effort `thinking: {type:
// "disabled"}` becomes by rendering a one-message chat with each effort (serving.py,
// _probe_disabled_thinking_effort): "none" where the renderer takes it and renders it unlike every real effort, else
// "low" (a template that rejects "none", or reads an unknown effort as its highest). The EPP renders with its own
// mirror of that renderer, so it runs the same probe on it and reaches the workers' answer for the served template.
import { EFFORTS, UNPROBED_DISABLED_THINKING, type DisabledThinkingEffort } from "./anthropic-thinking";
import { sameIds, type EncodeBody } from "./probe-render";

export function probeDisabledThinkingEffort(encodeBody: EncodeBody): DisabledThinkingEffort {
  const render = (effort: string) => {
    try {
      return encodeBody({ messages: [{ role: "user", content: "Hi" }], reasoning_effort: effort });
    } catch {
      return undefined;
    }
  };
  const none = render("none");
  if (none === undefined) return UNPROBED_DISABLED_THINKING;
  for (const effort of EFFORTS) {
    const ids = render(effort);
    if (ids !== undefined && sameIds(ids, none)) return UNPROBED_DISABLED_THINKING;
  }
  return "none";
}
