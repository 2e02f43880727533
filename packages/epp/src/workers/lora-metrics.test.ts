import { expect, test } from "bun:test";
import { parseVllmMetrics } from "./worker-metrics.ts";

// A vLLM server with --enable-lora --max-loras 2, as prometheus_client writes its gauge: labels sorted by name,
// max_lora as str(int), each adapter list joined by "," ("" for none), the value the time the engine
// recorded that state (set_to_current_time, in floatToGoString's exponent form). Every state it passed
// through stays exported; the newest is the third line, not the last.
const GOLDEN = [
  'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0',
  "# HELP vllm:lora_requests_info Running stats on lora requests.",
  "# TYPE vllm:lora_requests_info gauge",
  'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7650656011234567e+09',
  'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.765065602470221e+09',
  'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora,chat-lora",waiting_lora_adapters="code-lora"} 1.7650656031415927e+09',
  'vllm:lora_requests_info{max_lora="2",running_lora_adapters="chat-lora",waiting_lora_adapters=""} 1.7650656029e+09',
  'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0',
].join("\n");

const sets = (m: ReturnType<typeof parseVllmMetrics>) =>
  m.lora && { running: [...m.lora.running], waiting: [...m.lora.waiting], maxLora: m.lora.maxLora };

test("vllm:lora_requests_info: the newest series is the engine's adapters now, beside the load gauges", () => {
  const m = parseVllmMetrics(GOLDEN);
  expect(sets(m)).toEqual({ running: ["sql-lora", "chat-lora"], waiting: ["code-lora"], maxLora: 2 });
  expect([m.running, m.waiting]).toEqual([3, 1]);
});

test("an idle newest state is no adapter at all; without the gauge (LoRA off) nothing is reported", () => {
  const idle = 'vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7650657e+09';
  expect(sets(parseVllmMetrics(`${GOLDEN}\n${idle}`))).toEqual({ running: [], waiting: [], maxLora: 4 });
  expect(parseVllmMetrics(GOLDEN.split("\n").filter((l) => !l.includes("lora")).join("\n")).lora).toBeUndefined();
});

test("names are trimmed and unescaped, empty entries dropped; equal times keep the first; a missing max_lora is no room", () => {
  const m = parseVllmMetrics(
    [
      'vllm:lora_requests_info{max_lora="1",running_lora_adapters="a, b,,",waiting_lora_adapters="q\\"uote"} 5',
      'vllm:lora_requests_info{max_lora="1",running_lora_adapters="later",waiting_lora_adapters=""} 5',
    ].join("\n"),
  );
  expect(sets(m)).toEqual({ running: ["a", "b"], waiting: ['q"uote'], maxLora: 1 });
  expect(parseVllmMetrics('vllm:lora_requests_info{running_lora_adapters="a",waiting_lora_adapters=""} 1').lora?.maxLora).toBe(0);
});
