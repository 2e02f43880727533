import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "bun:test";
import { guessConversationTemplate, sglangConversationTemplate, servedConversationTemplate } from "./sglang-conversation";

const noConfig = () => undefined;
const guess = (path: string, modelType?: string) => guessConversationTemplate(path, () => modelType)?.name;

describe("get_conv_template_by_model_path's matchers (conversation.py)", () => {
  test("paths each matcher recognizes, case-insensitively", () => {
    const cases: [string, string][] = [
      ["WePOINTS/POINTS-1-5-Qwen-2-5-7B-Chat", "points-v15-chat"],
      ["tencent/POINTS-Reader", "points-v15-chat"],
      ["OpenGVLab/InternVL2_5-8B", "internvl-2-5"],
      ["/models/internvl3-2b", "internvl-2-5"],
      ["deepseek-ai/Janus-Pro-7B", "janus-pro"],
      ["lmsys/vicuna-7b-v1.5", "vicuna_v1.1"],
      ["liuhaotian/llava-v1.5-7b", "vicuna_v1.1"],
      ["lmms-lab/LLaVA-NeXT-Video-7B", "vicuna_v1.1"],
      ["deepseek-ai/deepseek-vl2-tiny", "deepseek-vl2"],
      ["liuhaotian/llava-v1.6-34b", "chatml-llava"],
      ["lmms-lab/llava-onevision-qwen2-7b-ov", "chatml-llava"],
      ["openbmb/MiniCPM-V-2_6", "minicpmv"],
      ["openbmb/MiniCPM-o-2_6", "minicpmo"],
      ["microsoft/Phi-4-multimodal-instruct", "phi-4-mm"],
      ["deepseek-ai/DeepSeek-OCR", "deepseek-ocr"],
      ["PaddlePaddle/PaddleOCR-VL", "paddle-ocr"],
      ["openai/whisper-large-v3", "whisper"],
    ];
    for (const [path, template] of cases) expect([path, guess(path)]).toEqual([path, template]);
  });

  test("near misses match nothing: the tokenizer's Jinja template renders them", () => {
    for (const path of [
      "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct", "default",
      // \bpoints\b: a whole word only.
      "acme/checkpoints-7b", "acme/pointset-1b", "acme/épointsé",
      "liuhaotian/llava-v1.6-mistral-7b", "llava-v15-7b", "deepseek-vl-7b",
      "openbmb/MiniCPM3-4B", "microsoft/Phi-4-mini-instruct", "deepseek-ai/DeepSeek-V3", "PaddlePaddle/ERNIE-4.5",
    ]) expect([path, guess(path)]).toEqual([path, undefined]);
  });

  test("the first matcher in registration order wins", () => {
    // match_points_v15_chat runs first, match_internvl before match_vicuna, match_vicuna before match_qwen_chat_ml.
    expect(guessConversationTemplate("points-internvl", noConfig)).toEqual({ name: "points-v15-chat", fn: "match_points_v15_chat" });
    expect(guessConversationTemplate("internvl-vicuna", noConfig)).toEqual({ name: "internvl-2-5", fn: "match_internvl" });
    expect(guessConversationTemplate("vicuna-llava-onevision-qwen2", noConfig)).toEqual({ name: "vicuna_v1.1", fn: "match_vicuna" });
    expect(guess("janus-deepseek-vl2")).toBe("janus-pro");
  });

  test("config.json's model_type answers at the first matcher that looks, before later paths' matchers", () => {
    expect(guessConversationTemplate("/models/m", () => "minicpmv")).toEqual({ name: "minicpmv", fn: "match_internvl" });
    // A vicuna path whose config names a mapped type gets the type's template: match_internvl looks first.
    expect(guess("/models/vicuna-7b", "deepseek_vl_v2")).toBe("deepseek-vl2");
    // match_points_v15_chat does not look; an unmapped, or non-string, model_type names nothing.
    expect(guess("/models/points", "whisper")).toBe("points-v15-chat");
    expect(guess("/models/vicuna-7b", "llama")).toBe("vicuna_v1.1");
    expect(guessConversationTemplate("/models/m", () => ["whisper"])).toBeUndefined();
    expect(guessConversationTemplate("/models/m", () => "constructor")).toBeUndefined();
  });

  test("the model_type is read from <model path>/config.json, as get_model_type reads it", () => {
    const root = mkdtempSync(join(tmpdir(), "sglang-conv-"));
    try {
      const dir = join(root, "model");
      mkdirSync(dir);
      writeFileSync(join(dir, "config.json"), JSON.stringify({ model_type: "internvl_chat" }));
      expect(guessConversationTemplate(dir)?.name).toBe("internvl-2-5");
      writeFileSync(join(dir, "config.json"), "{ not json");
      expect(guessConversationTemplate(dir)).toBeUndefined();
      expect(guessConversationTemplate(join(root, "absent"))).toBeUndefined();
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

describe("whether SGLang renders with a conversation template (TemplateManager.load_chat_template)", () => {
  test("a --chat-template other than a .jinja file is a conversation template, whatever the model path", () => {
    expect(sglangConversationTemplate({ chatTemplate: "chatml", modelPath: "Qwen/Qwen3-8B" }, noConfig)).toMatchObject({ name: "chatml", why: expect.stringContaining("--chat-template") });
    expect(sglangConversationTemplate({ chatTemplate: "/etc/templates/mine.json" }, noConfig)?.name).toBe("/etc/templates/mine.json");
  });

  test("a .jinja --chat-template is a Jinja template, even for a path SGLang would guess for", () => {
    expect(sglangConversationTemplate({ chatTemplate: "/t/served.jinja", modelPath: "lmsys/vicuna-7b-v1.5" }, noConfig)).toBeNull();
  });

  test("without --chat-template the model path is guessed from; nothing guessed is the Jinja template", () => {
    expect(sglangConversationTemplate({ modelPath: "lmsys/vicuna-7b-v1.5" }, noConfig)).toMatchObject({ name: "vicuna_v1.1", why: expect.stringContaining("match_vicuna") });
    expect(sglangConversationTemplate({ chatTemplate: "", modelPath: "openbmb/MiniCPM-V-2_6" }, noConfig)?.name).toBe("minicpmv");
    expect(sglangConversationTemplate({ modelPath: "Qwen/Qwen3-8B" }, noConfig)).toBeNull();
    expect(sglangConversationTemplate({}, noConfig)).toBeNull();
  });

  test("only SGLang workers with a tokenizer are asked", () => {
    const opts = { tokenizerDir: "/t", modelPath: "lmsys/vicuna-7b-v1.5" };
    expect(servedConversationTemplate({ ...opts, chatRendering: "sglang" })?.name).toBe("vicuna_v1.1");
    expect(servedConversationTemplate({ ...opts, chatRendering: "vllm" })).toBeNull();
    expect(servedConversationTemplate({ modelPath: opts.modelPath, chatRendering: "sglang" })).toBeNull();
  });
});
