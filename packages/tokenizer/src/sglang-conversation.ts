// Whether SGLang's OpenAI server renders a model's chats with one of its own conversation templates (FastChat-style
// Python formatting, python/sglang/srt/parser/conversation.py) instead of a Jinja chat template. Such a prompt is not
// mirrored here: every chat of that model is routed by load (sglang-gaps.ts checkJinjaRendered), never hashed as the
// Jinja template would render it. The facts, from SGLang:
// - python/sglang/srt/parser/template_manager.py TemplateManager.load_chat_template, called at startup with the
//   server's --model-path and --chat-template (python/sglang/srt/entrypoints/engine.py init_tokenizer_manager): a
//   non-empty --chat-template goes to _load_explicit_chat_template; otherwise guess_chat_template_from_model_path runs
//   first and the tokenizer's (or processor's) Jinja template is used only when it guesses nothing.
// - _load_explicit_chat_template: a registered conversation template's name (chat_template_exists) is used as one;
//   else the value must be an existing file: a `.jinja` file is a Jinja template, any other a JSON conversation
//   template (_load_json_chat_template). No registered name ends in `.jinja`.
// - python/sglang/srt/entrypoints/chat_input/renderers.py ChatRenderer.render: with a conversation template named,
//   every chat request renders through _apply_conversation_template (generate_chat_conv), text-only or multimodal.
// - conversation.py get_conv_template_by_model_path: the functions registered with
//   register_conv_template_matching_function, in registration order, the first answer winning (MATCHERS below).
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { PreprocessorOptions } from "./types";

/** The conversation template SGLang renders a model's chats with, and how it came to. */
export type ConversationTemplate = { name: string; why: string };

/** `<model path>/config.json`'s model_type, as SGLang's get_model_type reads it; undefined when it reads none. */
export type ModelTypeOf = (modelPath: string) => unknown;

type Matcher = {
  /** The SGLang function (conversation.py). */
  fn: string;
  /** The template its test of the model path names, if any. */
  byPath: (path: string) => string | undefined;
  /** Whether it falls back to config.json's model_type (MODEL_TYPE_TEMPLATES) when the path says nothing. */
  byModelType: boolean;
};

const search = (pattern: RegExp, template: string) => (path: string) => (pattern.test(path) ? template : undefined);
const contains = (part: string, template: string) => (path: string) => (path.toLowerCase().includes(part) ? template : undefined);
// Python's \w in a str pattern: letters, digits and numerals of any script, and `_` (JS's \b knows only ASCII).
const WORD = "[\\p{L}\\p{N}_]";

/**
 * conversation.py's matchers in registration order, each a case-insensitive test of the model path (re.search with
 * re.IGNORECASE, or `in model_path.lower()`), as of the newest conversation.py read (the one holding match_paddle_ocr
 * and match_whisper; match_points_v15_chat's whole-word `\bpoints\b` replaced a bare `points`).
 */
const MATCHERS: readonly Matcher[] = [
  { fn: "match_points_v15_chat", byPath: search(new RegExp(`(?<!${WORD})points(?!${WORD})`, "iu"), "points-v15-chat"), byModelType: false },
  { fn: "match_internvl", byPath: search(/internvl/iu, "internvl-2-5"), byModelType: true },
  { fn: "match_deepseek_janus_pro", byPath: search(/janus/iu, "janus-pro"), byModelType: true },
  { fn: "match_vicuna", byPath: search(/vicuna|llava-v1\.5|llava-next-video-7b/iu, "vicuna_v1.1"), byModelType: false },
  { fn: "match_deepseek_vl", byPath: search(/deepseek.*vl2/iu, "deepseek-vl2"), byModelType: true },
  {
    fn: "match_qwen_chat_ml",
    byPath: search(/llava-v1\.6-34b|llava-v1\.6-yi-34b|llava-next-video-34b|llava-onevision-qwen2/iu, "chatml-llava"),
    byModelType: false,
  },
  { fn: "match_minicpm", byPath: (path) => { const m = /minicpm-(v|o)/iu.exec(path); return m ? `minicpm${m[1]!.toLowerCase()}` : undefined; }, byModelType: true },
  { fn: "match_phi_4_mm", byPath: contains("phi-4-multimodal", "phi-4-mm"), byModelType: true },
  { fn: "match_deepseek_ocr", byPath: contains("deepseek-ocr", "deepseek-ocr"), byModelType: true },
  { fn: "match_paddle_ocr", byPath: contains("paddleocr", "paddle-ocr"), byModelType: true },
  { fn: "match_whisper", byPath: contains("whisper", "whisper"), byModelType: true },
];

/** conversation.py MODEL_TYPE_TO_TEMPLATE: config.json's model_type -> template, for the matchers that fall back to it. */
const MODEL_TYPE_TEMPLATES: Readonly<Record<string, string>> = {
  internvl_chat: "internvl-2-5",
  deepseek_vl_v2: "deepseek-vl2",
  multi_modality: "janus-pro",
  phi4mm: "phi-4-mm",
  minicpmv: "minicpmv",
  minicpmo: "minicpmo",
  "deepseek-ocr": "deepseek-ocr",
  paddleocr_vl: "paddle-ocr",
  whisper: "whisper",
};

/**
 * get_conv_template_by_model_path: the first matcher's answer, by the path's text or else (for those that look)
 * by the model_type of the config.json under it; undefined when none answers.
 */
export function guessConversationTemplate(modelPath: string, modelTypeOf: ModelTypeOf = modelTypeAt): { name: string; fn: string } | undefined {
  // Read once: each matcher that looks reads the same file.
  let byModelType: { name: string | undefined } | undefined;
  for (const m of MATCHERS) {
    let name = m.byPath(modelPath);
    if (name === undefined && m.byModelType) name = (byModelType ??= { name: templateOfType(modelTypeOf(modelPath)) }).name;
    if (name !== undefined) return { name, fn: m.fn };
  }
  return undefined;
}

/**
 * The conversation template an SGLang server started with `chatTemplate` (its --chat-template) and `modelPath` (its
 * --model-path) renders every chat with, or null when it renders with a Jinja template.
 */
export function sglangConversationTemplate(
  server: { chatTemplate?: string; modelPath?: string },
  modelTypeOf: ModelTypeOf = modelTypeAt,
): ConversationTemplate | null {
  const { chatTemplate, modelPath } = server;
  if (chatTemplate) {
    if (chatTemplate.endsWith(".jinja")) return null;
    return { name: chatTemplate, why: "--chat-template is no .jinja file: SGLang takes it as one of its conversation templates (a registered name, or a JSON file of one)" };
  }
  const guessed = modelPath ? guessConversationTemplate(modelPath, modelTypeOf) : undefined;
  if (guessed === undefined) return null;
  return { name: guessed.name, why: `SGLang guesses it from the model path ${JSON.stringify(modelPath)} (conversation.py ${guessed.fn}), before the tokenizer's template` };
}

/**
 * The conversation template the SGLang workers of a preprocessor built with `opts` render with; null for vLLM's, or
 * without a tokenizer (the byte-level fallback renders no template).
 */
export function servedConversationTemplate(opts: PreprocessorOptions): ConversationTemplate | null {
  if (opts.chatRendering !== "sglang" || opts.tokenizerDir === undefined) return null;
  return sglangConversationTemplate({ chatTemplate: opts.chatTemplate, modelPath: opts.modelPath });
}

// MODEL_TYPE_TO_TEMPLATE.get(model_type): a model_type that is no string names no template.
const templateOfType = (t: unknown) => (typeof t === "string" && Object.hasOwn(MODEL_TYPE_TEMPLATES, t) ? MODEL_TYPE_TEMPLATES[t] : undefined);

/** get_model_type: `<model path>/config.json`'s model_type, read where SGLang reads it (relative paths from the working directory). */
function modelTypeAt(modelPath: string): unknown {
  const file = join(modelPath, "config.json");
  if (!existsSync(file)) return undefined;
  try {
    const config: unknown = JSON.parse(readFileSync(file, "utf8"));
    return typeof config === "object" && config !== null ? (config as Record<string, unknown>).model_type : undefined;
  } catch {
    return undefined;
  }
}
