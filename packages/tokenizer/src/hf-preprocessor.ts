import { Tokenizer } from "@huggingface/tokenizers";
import { detectContentFormat, type ContentFormat } from "./content-format";
import { conversation } from "./conversation";
import { ChatTemplateError, continueFinalMessage, templateTools } from "./messages";
import { PyTemplate } from "./py-template";
import { truncatePrompt } from "./truncation";
import { SegmentCache } from "./segment-cache";
import { Segmenter } from "./segmenter";
import { tokenContent, type TokenizerFiles } from "./tokenizer-files";
import { NO_CACHE_STATS, type CacheOptions, type CacheStats, type ChatMessage, type ChatOptions, type CompletionOptions, type Preprocessor } from "./types";

/** A Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) with its chat template and segment cache. */
export class HfPreprocessor implements Preprocessor {
  readonly kind = "hf" as const;
  private readonly tokenizer: Tokenizer;
  private readonly template: PyTemplate | null;
  /** vLLM's content format for this template (`--chat-template-content-format auto`). */
  readonly contentFormat: ContentFormat;
  private readonly templateTokens: Record<string, unknown>;
  private readonly segmenter: Segmenter;
  private readonly cache: SegmentCache | null;
  // What the model's post-processor adds around a single text (e.g. [bos] before it), learned once by probing.
  private readonly completionPrefix: Uint32Array;
  private readonly completionSuffix: Uint32Array;

  constructor(files: TokenizerFiles, cache: CacheOptions | false) {
    const { tokenizerJson, config, chatTemplate } = files;
    this.tokenizer = new Tokenizer(tokenizerJson, config);
    this.template = chatTemplate === null ? null : new PyTemplate(chatTemplate);
    this.contentFormat = this.template === null ? "string" : detectContentFormat(this.template.ast);
    // transformers hands the template the tokenizer's special tokens that are set (special_tokens_map).
    this.templateTokens = {};
    for (const name of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"] as const) {
      const content = tokenContent(config[name] as Parameters<typeof tokenContent>[0]);
      if (content !== null) this.templateTokens[name] = content;
    }
    if (config.additional_special_tokens?.length) this.templateTokens.additional_special_tokens = config.additional_special_tokens.map(tokenContent);
    this.segmenter = new Segmenter(this.tokenizer, tokenizerJson.added_tokens, tokenizerJson.normalizer != null);
    this.cache = cache === false ? null : new SegmentCache(cache);
    [this.completionPrefix, this.completionSuffix] = this.probeSpecialTokenRules(files);
  }

  encodeCompletion(prompt: string | readonly number[], opts: CompletionOptions = {}): Uint32Array {
    if (typeof prompt !== "string") return truncatePrompt(Uint32Array.from(prompt), opts);
    return this.withSpecialTokens(this.encodeText(prompt), opts.addSpecialTokens ?? true, opts);
  }

  renderChat(messages: readonly ChatMessage[], opts: ChatOptions = {}): string {
    if (this.template === null) throw new ChatTemplateError("the model's tokenizer has no chat template");
    const chat = conversation(messages, this.contentFormat);
    // As transformers renders: the special tokens, then the request's chat_template_kwargs, then what the
    // request's own fields say (vLLM passes tools=None and documents=None when the request has none).
    const vars: Record<string, unknown> = {
      ...this.templateTokens,
      ...opts.templateKwargs,
      messages: chat,
      tools: opts.tools === undefined ? null : templateTools(opts.tools),
      documents: null,
      add_generation_prompt: opts.addGenerationPrompt ?? true,
    };
    let rendered: string;
    try {
      rendered = this.template.render(vars);
    } catch (err) {
      // raise_exception() in the template, or a value it cannot handle: the request's doing.
      throw new ChatTemplateError(`chat template failed: ${(err as Error).message}`);
    }
    return opts.continueFinalMessage ? continueFinalMessage(rendered, chat) : rendered;
  }

  encodeChat(messages: readonly ChatMessage[], opts: ChatOptions = {}): Uint32Array {
    // vLLM tokenizes the rendered chat with the request's add_special_tokens, false by default: the template
    // already placed them (true on a template that starts with bos gives two).
    return this.withSpecialTokens(this.encodeText(this.renderChat(messages, opts)), opts.addSpecialTokens ?? false, opts);
  }

  // What the tokenizer's post-processor adds when asked to, and truncate_prompt_tokens applied around it.
  private withSpecialTokens(body: Uint32Array, add: boolean, opts: CompletionOptions): Uint32Array {
    return add ? truncatePrompt(body, opts, this.completionPrefix, this.completionSuffix) : truncatePrompt(body, opts);
  }

  decode(ids: ArrayLike<number>): string {
    return ids.length === 0 ? "" : this.tokenizer.decode(Array.from(ids), { skip_special_tokens: false });
  }

  cacheStats(): CacheStats {
    return this.cache === null ? NO_CACHE_STATS : this.cache.stats();
  }

  private encodeText(text: string): Uint32Array {
    if (this.cache === null) return Uint32Array.from(this.tokenizer.encode(text, { add_special_tokens: false }).ids);
    return this.segmenter.encode(text, this.cache);
  }

  // The tokenizer.json post-processor decides what a text prompt gets (vLLM calls the tokenizer with
  // add_special_tokens=True). Its additions are found by encoding a probe with and without them. Like
  // transformers' Llama-style fast tokenizers, an explicit add_bos_token/add_eos_token in the config wins.
  private probeSpecialTokenRules(files: TokenizerFiles): [Uint32Array, Uint32Array] {
    const probe = "a";
    const bare = this.tokenizer.encode(probe, { add_special_tokens: false }).ids;
    const full = this.tokenizer.encode(probe, { add_special_tokens: true }).ids;
    let at = 0;
    while (at + bare.length <= full.length && !bare.every((id, i) => full[at + i] === id)) at++;
    if (at + bare.length > full.length) throw new Error("tokenizer post-processor drops the text it is given");
    let prefix = full.slice(0, at);
    let suffix = full.slice(at + bare.length);
    const id = (v: Parameters<typeof tokenContent>[0]) => {
      const c = tokenContent(v);
      return c === null ? undefined : this.tokenizer.token_to_id(c);
    };
    const bos = id(files.config.bos_token);
    const eos = id(files.config.eos_token);
    if (bos !== undefined && files.config.add_bos_token === true && prefix[0] !== bos) prefix = [bos, ...prefix];
    if (bos !== undefined && files.config.add_bos_token === false && prefix[0] === bos) prefix = prefix.slice(1);
    if (eos !== undefined && files.config.add_eos_token === true && suffix.at(-1) !== eos) suffix = [...suffix, eos];
    if (eos !== undefined && files.config.add_eos_token === false && suffix.at(-1) === eos) suffix = suffix.slice(0, -1);
    return [Uint32Array.from(prefix), Uint32Array.from(suffix)];
  }
}
