// vLLM's vllm:lora_requests_info (v1/metrics/loggers.py), present when the engine runs with --enable-lora.
// Its labels are the state: max_lora (--max-loras), then waiting_lora_adapters and running_lora_adapters,
// each the adapters of the waiting or running requests joined by "," ("" for none). Its value is the time
// the engine recorded that state (set_to_current_time), and every label set ever recorded stays exported,
// so the series with the newest value is the current state (llm-d reads it the same way). The gauge has no
// `engine` label: an API server fronting several DP engines exports one state, whichever engine recorded last.
import type { LoraAdapters } from "@kv-epp/routing";

export const LORA_INFO = "vllm:lora_requests_info";

/** A label's value as the exposition format escapes it (backslash, double quote, newline), unescaped. */
const unescape = (v: string) => v.replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c));

/** A comma-separated adapter list, each name trimmed, empty entries dropped ("" is no adapter). */
function adapterList(v: string | undefined): Set<string> {
  const out = new Set<string>();
  if (v === undefined) return out;
  for (const name of unescape(v).split(",")) {
    const n = name.trim();
    if (n.length > 0) out.add(n);
  }
  return out;
}

/** The newest of a scrape's vllm:lora_requests_info series: fed each series line, read once at the end. */
export class NewestLoraInfo {
  private newest = -Infinity;
  private line: string | undefined;

  /** A series of the gauge and its value; the first of equal values stays, as llm-d keeps it. */
  add(line: string, value: number): void {
    if (!(value > this.newest)) return;
    this.newest = value;
    this.line = line;
  }

  /** The engine's adapters by the newest series (`labelOf` reads a label); undefined when the scrape had none (LoRA not enabled). */
  adapters(labelOf: (line: string, label: string) => string | undefined): LoraAdapters | undefined {
    const line = this.line;
    if (line === undefined) return undefined;
    const max = Number(labelOf(line, "max_lora"));
    return {
      running: adapterList(labelOf(line, "running_lora_adapters")),
      waiting: adapterList(labelOf(line, "waiting_lora_adapters")),
      maxLora: Number.isInteger(max) && max > 0 ? max : 0,
    };
  }
}
