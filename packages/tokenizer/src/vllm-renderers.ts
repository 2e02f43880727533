// Which of vLLM's renderers serves a model. Only its HF renderer renders a Jinja template, the one path mirrored
// here; the others (Harmony for gpt-oss, the renderers its tokenizer mode selects) build prompts in Python code of
// their own, so a chat of such a model is routed by load (ChatUnrenderable) instead of hashed as a prompt the
// workers never see.
import { readModelFiles, type ModelFiles } from "./tokenizer-files";
import type { PreprocessorOptions } from "./types";

/** vLLM's --tokenizer-mode by default. */
export const DEFAULT_TOKENIZER_MODE = "auto";

/**
 * The tokenizer modes vLLM renders through its HF renderer with the tokenizer files read here: "hf", "slow" (the same,
 * its slow tokenizer) and "auto" when it resolves to "hf" (tokenizers/registry.py resolve_tokenizer_args).
 */
const JINJA_MODES = new Set([DEFAULT_TOKENIZER_MODE, "hf", "slow"]);

/**
 * Architectures ModelConfig gives a tokenizer mode of their own under "auto", each selecting a renderer that is not
 * HF's, or HF's over a tokenizer not read here (kimi_audio and qwen_vl tokenize with tiktoken). The list changes
 * between vLLM releases: this is every release's, as routing such a chat by load is never wrong.
 */
const ARCHITECTURE_MODES: Readonly<Record<string, string>> = {
  Grok1ForCausalLM: "grok2",
  MoonshotKimiaForCausalLM: "kimi_audio",
  QwenVLForConditionalGeneration: "qwen_vl",
  KimiK3ForConditionalGeneration: "kimi_k3",
  DeepseekV32ForCausalLM: "deepseek_v32",
  DeepseekV4ForCausalLM: "deepseek_v4",
  DeepseekV4ForConditionalGeneration: "deepseek_v4",
  DeepseekV41ForCausalLM: "deepseek_v41",
};

/**
 * How vLLM started with `--tokenizer-mode mode` renders the chats of the model `files` describe when not with a
 * Jinja template (a phrase for a log or an error), or undefined when its HF renderer renders them.
 */
export function vllmOtherRenderer(mode: string, files: ModelFiles): string | undefined {
  // OnlineRenderer.render_chat: gpt-oss chats go through Harmony whatever the tokenizer mode.
  if (files.modelType === "gpt_oss") return "through Harmony (config.json's model_type gpt_oss)";
  if (!JINJA_MODES.has(mode)) return `through the renderer of its tokenizer mode ${JSON.stringify(mode)} (--tokenizer-mode)`;
  if (mode !== DEFAULT_TOKENIZER_MODE) return undefined;
  const architecture = Array.isArray(files.architectures) ? files.architectures[0] : undefined;
  if (typeof architecture === "string" && Object.hasOwn(ARCHITECTURE_MODES, architecture))
    return `through the renderer of its tokenizer mode ${JSON.stringify(ARCHITECTURE_MODES[architecture])} (which --tokenizer-mode auto picks for ${architecture})`;
  if (files.mistralTokenizer) return "through Mistral's own tokenizer (--tokenizer-mode auto picks it for a tekken.json or tokenizer.model.v* file)";
  return undefined;
}

/**
 * How the vLLM workers of a preprocessor built with `opts` render its chats when not with a Jinja template (for a
 * warning at startup), or null: vLLM's Jinja renderer, SGLang's rules, or no tokenizer directory.
 */
export function servedVllmRenderer(opts: PreprocessorOptions): string | null {
  if ((opts.chatRendering ?? "vllm") !== "vllm" || opts.tokenizerDir === undefined) return null;
  return vllmOtherRenderer(opts.tokenizerMode ?? DEFAULT_TOKENIZER_MODE, readModelFiles(opts.tokenizerDir)) ?? null;
}
