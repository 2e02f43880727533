import { describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { flagName, optionsMarkdown, withOptionsSection } from "@kv-epp/options";
import { tempDir } from "@kv-epp/testkit";
import { writeStaticConfig } from "../test/helpers.ts";
import { ConfigError, parseConfig, preprocessorOptions, usage } from "./config.ts";
import { EPP_OPTIONS, EPP_PROGRAM } from "./options.ts";

const worker = { id: "a", address: "127.0.4.1:8000", kvEvents: "tcp://127.0.4.1:5557" };
const withOptions = (options: Record<string, unknown>) => writeStaticConfig([worker], [], options);

describe("every option resolves by one rule: flag > DYN_EPP_* variable > config file > default", () => {
  const file = withOptions({ grpcPort: 7000, latencyFollowerWeight: 2, model: "file-model", loraAdapters: ["f1"] });
  const env = { DYN_EPP_GRPC_PORT: "7100", DYN_EPP_LATENCY_FOLLOWER_WEIGHT: "3", DYN_EPP_MODEL: "env-model" };

  test("a file's option wins over the default", () => {
    const c = parseConfig(["--config", file], {});
    expect(c.ports.grpc).toBe(7000);
    expect(c.picker.latencyFollowerWeight).toEqual({ base: 2, max: 12 });
    expect(c.model).toMatchObject({ name: "file-model", loraAdapters: ["f1"] });
    expect(c.ports.metrics).toBe(9090);
  });

  test("the variable wins over the file", () => {
    const c = parseConfig(["--config", file], env);
    expect(c.ports.grpc).toBe(7100);
    expect(c.picker.latencyFollowerWeight.base).toBe(3);
    expect(c.model.name).toBe("env-model");
  });

  test("the flag wins over the variable and the file, routing's options and the static file's model included", () => {
    const c = parseConfig(["--config", file, "--grpc-port", "7200", "--latency-follower-weight", "4", "--model", "flag-model", "--lora-adapters", "x,y"], env);
    expect(c.ports.grpc).toBe(7200);
    expect(c.picker.latencyFollowerWeight.base).toBe(4);
    expect(c.model).toMatchObject({ name: "flag-model", loraAdapters: ["x", "y"] });
  });

  test("--default-chat-template-kwargs is a JSON object's text from the flag or the variable, or an object in the file", () => {
    // Kept as text, which the tokenizer parses as Python's json does (1.0 a float).
    const text = '{"enable_thinking": false, "temperature_hint": 1.0}';
    expect(parseConfig(["--config", file, "--default-chat-template-kwargs", text], {}).defaultChatTemplateKwargs).toBe(text);
    expect(parseConfig(["--config", file], { DYN_EPP_DEFAULT_CHAT_TEMPLATE_KWARGS: '{"reasoning_effort": "low"}' }).defaultChatTemplateKwargs).toBe('{"reasoning_effort": "low"}');
    expect(JSON.parse(parseConfig(["--config", withOptions({ defaultChatTemplateKwargs: { enable_thinking: false } })], {}).defaultChatTemplateKwargs!)).toEqual({ enable_thinking: false });
    expect(parseConfig(["--config", file], {}).defaultChatTemplateKwargs).toBeUndefined();
    for (const bad of ["{not json", "[1]", "true"]) {
      expect(() => parseConfig(["--config", file, "--default-chat-template-kwargs", bad], {})).toThrow(/default-chat-template-kwargs.*expected a JSON object/);
    }
  });

  test("the workers' vLLM rendering flags reach the options every preprocessor is built with, the pool members' too", () => {
    const flags = [
      "--exclude-tools-when-tool-choice-none", "--chat-template", "{{ messages[0].content }}", "--chat-template-content-format", "openai",
      "--trust-request-chat-template", "--response-role", "model", "--tokenizer-mode", "mistral", "--anthropic-inline-system", "fold",
      "--anthropic-disabled-thinking-effort", "low",
    ];
    expect(preprocessorOptions(parseConfig(["--config", file, ...flags], {}))).toMatchObject({
      tokenizerDir: undefined, model: "file-model", excludeToolsWhenToolChoiceNone: true, chatTemplate: "{{ messages[0].content }}",
      chatTemplateContentFormat: "openai", trustRequestChatTemplate: true, responseRole: "model", tokenizerMode: "mistral", anthropicInlineSystem: "fold",
      anthropicDisabledThinkingEffort: "low",
    });
    expect(preprocessorOptions(parseConfig(["--config", file], {}))).toMatchObject({
      excludeToolsWhenToolChoiceNone: false, chatTemplateContentFormat: "auto", trustRequestChatTemplate: false, responseRole: "assistant", tokenizerMode: "auto", anthropicInlineSystem: "auto",
      anthropicDisabledThinkingEffort: "auto",
    });
    expect(preprocessorOptions(parseConfig(["--config", file], { DYN_EPP_TOKENIZER_MODE: "hf" })).tokenizerMode).toBe("hf");
    expect(() => parseConfig(["--config", file, "--response-role", ""], {})).toThrow(/response-role/);
    expect(() => parseConfig(["--config", file, "--tokenizer-mode", ""], {})).toThrow(/tokenizer-mode/);
    expect(() => parseConfig(["--config", file, "--chat-template-content-format", "jinja"], {})).toThrow(/chat-template-content-format/);
    expect(preprocessorOptions(parseConfig(["--config", file], { DYN_EPP_ANTHROPIC_INLINE_SYSTEM: "preserve" })).anthropicInlineSystem).toBe("preserve");
    expect(() => parseConfig(["--config", file, "--anthropic-inline-system", "hoist"], {})).toThrow(/anthropic-inline-system/);
    expect(() => parseConfig(["--config", file, "--anthropic-disabled-thinking-effort", "minimal"], {})).toThrow(/anthropic-disabled-thinking-effort/);
  });

  test("the workers' SGLang --model-path reaches every preprocessor, the model's name when not given", () => {
    expect(preprocessorOptions(parseConfig(["--config", file, "--chat-rendering", "sglang"], {})).modelPath).toBe("file-model");
    expect(preprocessorOptions(parseConfig(["--config", file, "--model-path", "/models/vicuna-7b"], {})).modelPath).toBe("/models/vicuna-7b");
    expect(preprocessorOptions(parseConfig(["--config", file], { DYN_EPP_MODEL_PATH: "lmsys/vicuna-7b-v1.5" })).modelPath).toBe("lmsys/vicuna-7b-v1.5");
  });

  test("--tokenizer-cache-bytes bounds every preprocessor's segment cache (64 MiB unless given; 0: none)", () => {
    expect(preprocessorOptions(parseConfig(["--config", file], {})).cache).toEqual({ maxBytes: 64 * 1024 * 1024 });
    expect(preprocessorOptions(parseConfig(["--config", file, "--tokenizer-cache-bytes", "1073741824"], {})).cache).toEqual({ maxBytes: 2 ** 30 });
    expect(preprocessorOptions(parseConfig(["--config", file], { DYN_EPP_TOKENIZER_CACHE_BYTES: "0" })).cache).toBe(false);
    expect(() => parseConfig(["--config", file, "--tokenizer-cache-bytes", "-1"], {})).toThrow(/tokenizer-cache-bytes/);
  });

  test("--chat-rendering names the workers' engine every preprocessor renders chats as, vLLM unless given", () => {
    expect(preprocessorOptions(parseConfig(["--config", file], {})).chatRendering).toBe("vllm");
    expect(preprocessorOptions(parseConfig(["--config", file, "--chat-rendering", "sglang"], {})).chatRendering).toBe("sglang");
    expect(() => parseConfig(["--config", file, "--chat-rendering", "trtllm"], {})).toThrow(/chat-rendering/);
  });

  test("--body-mode and --response-body-mode take every Envoy body mode but GRPC, auto unless given", () => {
    expect(parseConfig(["--config", file], {})).toMatchObject({ bodyMode: "auto", responseBodyMode: "auto" });
    for (const mode of ["none", "streamed", "buffered", "buffered-partial", "full-duplex"]) {
      expect(parseConfig(["--config", file, "--body-mode", mode, "--response-body-mode", mode], {})).toMatchObject({ bodyMode: mode, responseBodyMode: mode });
    }
    expect(parseConfig(["--config", file], { DYN_EPP_RESPONSE_BODY_MODE: "streamed" }).responseBodyMode).toBe("streamed");
    expect(() => parseConfig(["--config", file, "--response-body-mode", "grpc"], {})).toThrow(/response-body-mode/);
  });

  test("the config file's path itself comes from a flag or the variable", () => {
    expect(parseConfig([], { DYN_EPP_CONFIG: file }).ports.grpc).toBe(7000);
  });
});

describe("a bad option names where it came from", () => {
  test.each([
    [{ grpcPort: 70000 }, /invalid value for grpcPort in --config ".*epp\.yaml": 70000/],
    [{ cost: "cheapest" }, /invalid value for cost in --config ".*": "cheapest" \(expected latency\|weights\)/],
    [{ secureServing: "sometimes" }, /secureServing in --config ".*": "sometimes" \(expected true\|false\)/],
    [{ grpcPrt: 9002 }, /unknown option "grpcPrt" in --config/],
  ])("a config file with %j is refused", (options, message) => {
    const path = withOptions(options);
    expect(() => parseConfig(["--config", path], {})).toThrow(ConfigError);
    expect(() => parseConfig(["--config", path], {})).toThrow(message);
  });

  test("a rule across options names the source of the value it refuses", () => {
    expect(() => parseConfig(["--config", withOptions({ replicaAggTimeoutMs: 500 })], {})).toThrow(/replicaAggTimeoutMs in --config ".*": 500 \(expected > the heartbeat/);
    expect(() => parseConfig(["--pool-name", "p", "--dp-size", "2"], { DYN_EPP_KV_EVENTS_PORT: "65535" })).toThrow(/DYN_EPP_KV_EVENTS_PORT \(--kv-events-port\): "65535" \(rank 1/);
  });
});

describe("docs come from the declarations", () => {
  test("--help lists every flag, by section", () => {
    const text = usage();
    for (const key of Object.keys(EPP_OPTIONS)) expect(text).toContain(`  --${flagName(key)} `);
    for (const section of ["Servers:", "Routing: latency cost:", "Recovery (the index from a peer's /dump at start):"]) expect(text).toContain(`\n${section}\n`);
  });

  test("the README's example config file is one the EPP takes", () => {
    const readme = readFileSync(`${import.meta.dir}/../README.md`, "utf8");
    const example = /```yaml\n(# epp\.yaml[^]*?)```/.exec(readme)![1]!;
    const path = join(tempDir("epp-readme-"), "epp.yaml");
    writeFileSync(path, example);
    const c = parseConfig(["--config", path], {});
    expect(c.model).toMatchObject({ name: "Qwen/Qwen3-0.6B", blockSize: 16 });
    expect(c.picker.latencyFollowerWeight.base).toBe(2);
    expect(c.workers).toMatchObject({ mode: "static", list: [{ id: "worker-0" }] });
    expect(c.recovery).toEqual({ mode: "static", peers: ["http://10.0.0.9:9093"] });
  });

  test("the README's option tables are the declarations' (bun packages/epp/scripts/options-doc.ts rewrites them)", () => {
    const readme = readFileSync(`${import.meta.dir}/../README.md`, "utf8");
    expect(readme).toBe(withOptionsSection(readme, optionsMarkdown(EPP_OPTIONS, EPP_PROGRAM)));
  });
});
