import { Tokenizer } from "@huggingface/tokenizers";
import { detectContentFormat, type ContentFormat, type ContentFormatOption } from "./content-format";
import { conversation } from "./conversation";
import { ChatTemplateError, ChatUnrenderable, continueFinalMessage, templateTools } from "./messages";
import { compileFastTokenizer } from "./fast/fast-tokenizer";
import { postProcessorAdditions } from "./post-processor";
import { PyTemplate, TemplateRaised } from "./py-template";
import { truncatePrompt, truncates, type Truncation } from "./truncation";
import { Lru } from "./lru";
import { SegmentCache } from "./segment-cache";
import { Segmenter, type EncodeControl, type SectionEncoder } from "./segmenter";
import { pickChatTemplate, tokenContent, type TokenizerFiles } from "./tokenizer-files";
import { NO_CACHE_STATS, type CacheOptions, type CacheStats, type ChatMessage, type ChatOptions, type CompletionOptions, type Preprocessor } from "./types";

/** A Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) with its chat template and segment cache. */
export class HfPreprocessor implements Preprocessor {
  readonly kind = "hf" as const;
  // Built on first use: decode, and encoding only when the fast BPE does not implement the tokenizer.
  private library: Tokenizer | null = null;
  private readonly files: TokenizerFiles;
  // Each named template compiled once, on the first request that picks it (see pickChatTemplate).
  private readonly templates = new Map<string, ChatTemplate>();
  // Templates requests bring (--trust-request-chat-template), compiled once per text while they stay in use.
  private readonly requestTemplates = new Lru<string, ChatTemplate>(REQUEST_TEMPLATES_KEPT);
  /** vLLM's content format (`--chat-template-content-format auto`) of the template a request without tools gets. */
  readonly contentFormat: ContentFormat;
  private readonly templateTokens: Record<string, unknown>;
  private readonly encoder: SectionEncoder;
  private readonly segmenter: Segmenter;
  private readonly cache: SegmentCache | null;
  // What the model's post-processor adds around a single text (e.g. [bos] before it), learned once by probing.
  private readonly completionPrefix: Uint32Array;
  private readonly completionSuffix: Uint32Array;

  constructor(
    files: TokenizerFiles,
    cache: CacheOptions | false,
    fastBpe = true,
    private readonly server: ServerRendering = {},
  ) {
    const { tokenizerJson, config } = files;
    this.files = files;
    this.contentFormat = this.formatOf(this.templateFor(false));
    // transformers hands the template the tokenizer's special tokens that are set (special_tokens_map).
    this.templateTokens = {};
    for (const name of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"] as const) {
      const content = tokenContent(config[name] as Parameters<typeof tokenContent>[0]);
      if (content !== null) this.templateTokens[name] = content;
    }
    if (config.additional_special_tokens?.length) this.templateTokens.additional_special_tokens = config.additional_special_tokens.map(tokenContent);
    this.encoder = sectionEncoder(() => this.tokenizer, tokenizerJson, fastBpe);
    this.segmenter = new Segmenter(this.encoder, tokenizerJson.added_tokens, tokenizerJson.normalizer != null, cache === false ? undefined : cache.pieceChars);
    this.cache = cache === false ? null : new SegmentCache(cache);
    [this.completionPrefix, this.completionSuffix] = this.probeSpecialTokenRules(files);
  }

  // vLLM resolves the template, and from it the content format, with the request's tools (resolve_chat_template).
  private templateFor(hasTools: boolean): ChatTemplate | null {
    const given = this.server.chatTemplate;
    const picked = given !== undefined ? { name: "--chat-template", source: given } : pickChatTemplate(this.files.chatTemplate, hasTools);
    if (picked === null) return null;
    let t = this.templates.get(picked.name);
    if (t === undefined) {
      const compiled = new PyTemplate(picked.source);
      this.templates.set(picked.name, (t = { compiled, contentFormat: detectContentFormat(compiled.ast) }));
    }
    return t;
  }

  /**
   * The template a request brings, as vLLM takes it: refused (400) unless --trust-request-chat-template
   * (validate_chat_template); trusted, its `chat_template` wins, then the server's --chat-template, then its
   * chat_template_kwargs' own (ChatParams.get_apply_chat_template_kwargs, where an unset value or "auto" does not
   * count). Null: the server's template renders it.
   */
  private requestTemplate(opts: ChatOptions): ChatTemplate | null {
    const inKwargs = opts.templateKwargs?.chat_template;
    if (opts.chatTemplate === undefined && (inKwargs === undefined || inKwargs === null)) return null;
    if (!this.server.trustRequestChatTemplate) throw new ChatTemplateError(UNTRUSTED_TEMPLATE);
    const fromKwargs = inKwargs === null || inKwargs === "auto" ? undefined : inKwargs;
    const source = opts.chatTemplate || this.server.chatTemplate || fromKwargs;
    if (source === undefined || source === this.server.chatTemplate) return null;
    if (typeof source !== "string") throw new ChatTemplateError("chat_template_kwargs.chat_template must be a string");
    // A large one is compiled for its request and not kept: 16 of a body's size each would hold megabytes.
    if (source.length > REQUEST_TEMPLATE_KEPT_CHARS) return compileRequestTemplate(source);
    return this.requestTemplates.get(source) ?? this.requestTemplates.set(source, compileRequestTemplate(source));
  }

  // --chat-template-content-format forces the format; "auto" (the default) detects it on the template rendering.
  private formatOf(template: ChatTemplate | null): ContentFormat {
    const forced = this.server.contentFormat ?? "auto";
    return forced !== "auto" ? forced : (template?.contentFormat ?? "string");
  }

  private get tokenizer(): Tokenizer {
    return (this.library ??= new Tokenizer(this.files.tokenizerJson, this.files.config));
  }

  encodeCompletion(prompt: string | readonly number[], opts: CompletionOptions = {}, control?: EncodeControl): Uint32Array {
    if (typeof prompt !== "string") return truncatePrompt(Uint32Array.from(prompt), opts);
    const add = opts.addSpecialTokens ?? true;
    const body = this.encodeText(prompt, knownPrefixOf(control, opts, add ? this.completionPrefix : EMPTY));
    return this.withSpecialTokens(body, add, opts);
  }

  renderChat(messages: readonly ChatMessage[], opts: ChatOptions = {}): string {
    // vLLM's --exclude-tools-when-tool-choice-none: the template gets tools=None, and resolves as for a chat without.
    const tools = opts.toolChoice === "none" && this.server.excludeToolsWhenToolChoiceNone ? undefined : opts.tools;
    const own = this.requestTemplate(opts);
    const served = this.templateFor(tools !== undefined);
    const template = own ?? served;
    if (template === null) throw new ChatTemplateError("the model's tokenizer has no chat template");
    // vLLM detects the content format on ChatParams.chat_template: the request's own chat_template, else the
    // server's; a template given only in chat_template_kwargs renders the chat but does not choose its format.
    const chat = conversation(messages, this.formatOf(opts.chatTemplate ? template : served));
    // As transformers renders: the special tokens, apply_chat_template's default documents=None, then the request's
    // chat_template_kwargs (with its documents, see templateKwargsOf) over the server's defaults, then what the
    // request's own fields say (vLLM passes tools=None when the request has none).
    const vars: Record<string, unknown> = {
      ...this.templateTokens,
      documents: null,
      ...withDefaults(this.server.defaultKwargs ?? {}, opts.templateKwargs),
      messages: chat,
      tools: tools === undefined ? null : templateTools(tools),
      add_generation_prompt: opts.addGenerationPrompt ?? true,
    };
    let rendered: string;
    try {
      rendered = template.compiled.render(vars);
    } catch (err) {
      // raise_exception() in the template: the request's doing, a 400 as vLLM answers. Any other failure may be
      // the engine's here (jinja2 renders what @huggingface/jinja cannot): not a reason to refuse the request.
      if (err instanceof TemplateRaised) throw new ChatTemplateError(`chat template failed: ${err.message}`);
      throw new ChatUnrenderable(`chat template failed here: ${(err as Error).message}`);
    }
    return opts.continueFinalMessage ? continueFinalMessage(rendered, chat) : rendered;
  }

  encodeChat(messages: readonly ChatMessage[], opts: ChatOptions = {}, control?: EncodeControl): Uint32Array {
    // vLLM tokenizes the rendered chat with the request's add_special_tokens, false by default: the template
    // already placed them (true on a template that starts with bos gives two).
    const add = opts.addSpecialTokens ?? false;
    const body = this.encodeText(this.renderChat(messages, opts), knownPrefixOf(control, opts, add ? this.completionPrefix : EMPTY));
    return this.withSpecialTokens(body, add, opts);
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

  resetCache(): void {
    this.cache?.clear();
  }

  private encodeText(text: string, control?: EncodeControl): Uint32Array {
    if (this.cache === null) {
      control?.knownPrefix?.({ ids: new Uint32Array(0), unknownChars: text.length });
      return this.encoder.encode(text);
    }
    return this.segmenter.encode(text, this.cache, control);
  }

  // The tokenizer.json post-processor decides what a text prompt gets (vLLM calls the tokenizer with
  // add_special_tokens=True). Its additions are found by encoding a probe with and without them. Like
  // transformers' Llama-style fast tokenizers, an explicit add_bos_token/add_eos_token in the config wins.
  private probeSpecialTokenRules(files: TokenizerFiles): [Uint32Array, Uint32Array] {
    let { prefix, suffix } = postProcessorAdditions(files.tokenizerJson) ?? this.probePostProcessor();
    const id = (v: Parameters<typeof tokenContent>[0]) => {
      const c = tokenContent(v);
      return c === null ? undefined : tokenId(files.tokenizerJson, c);
    };
    const bos = id(files.config.bos_token);
    const eos = id(files.config.eos_token);
    if (bos !== undefined && files.config.add_bos_token === true && prefix[0] !== bos) prefix = [bos, ...prefix];
    if (bos !== undefined && files.config.add_bos_token === false && prefix[0] === bos) prefix = prefix.slice(1);
    if (eos !== undefined && files.config.add_eos_token === true && suffix.at(-1) !== eos) suffix = [...suffix, eos];
    if (eos !== undefined && files.config.add_eos_token === false && suffix.at(-1) === eos) suffix = suffix.slice(0, -1);
    return [Uint32Array.from(prefix), Uint32Array.from(suffix)];
  }

  // A post-processor not read from its description: its additions are found by encoding a probe with and
  // without them.
  private probePostProcessor(): { prefix: number[]; suffix: number[] } {
    const probe = "a";
    const bare = this.tokenizer.encode(probe, { add_special_tokens: false }).ids;
    const full = this.tokenizer.encode(probe, { add_special_tokens: true }).ids;
    let at = 0;
    while (at + bare.length <= full.length && !bare.every((id, i) => full[at + i] === id)) at++;
    if (at + bare.length > full.length) throw new Error("tokenizer post-processor drops the text it is given");
    return { prefix: full.slice(0, at), suffix: full.slice(at + bare.length) };
  }
}

// The purpose-built BPE when it implements this tokenizer (see fast/), else the library. Sections are
// independent under the fast BPE, which implements no position-dependent pre-tokenizer; its cut points let the
// segmenter cut long sections.
function sectionEncoder(library: () => Tokenizer, json: TokenizerFiles["tokenizerJson"], fastBpe: boolean): SectionEncoder {
  const fast = fastBpe ? compileFastTokenizer(json) : null;
  if (fast?.ok) return { encode: (text) => fast.tokenizer.encode(text), independentSections: true, cuts: fast.tokenizer.cuts };
  return {
    encode: (text) => Uint32Array.from(library().encode(text, { add_special_tokens: false }).ids),
    independentSections: false,
  };
}

function tokenId(json: TokenizerFiles["tokenizerJson"], content: string): number | undefined {
  return json.added_tokens.find((t) => t.content === content)?.id ?? (json.model as { vocab?: Record<string, number> })?.vocab?.[content];
}

const EMPTY = new Uint32Array(0);

type ChatTemplate = { compiled: PyTemplate; contentFormat: ContentFormat };

/** What the vLLM server's flags change in the chats it renders (see PreprocessorOptions). */
export type ServerRendering = {
  /** --default-chat-template-kwargs, parsed. */
  defaultKwargs?: Record<string, unknown>;
  excludeToolsWhenToolChoiceNone?: boolean;
  /** --chat-template, loaded (the template's text). */
  chatTemplate?: string;
  /** --chat-template-content-format. */
  contentFormat?: ContentFormatOption;
  trustRequestChatTemplate?: boolean;
};

/** vLLM's answer (400) to a request that brings a template the server does not trust. */
const UNTRUSTED_TEMPLATE =
  "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.";

/** Request templates kept compiled: a client sends one or a few; a client varying it per request pays a compile each. */
const REQUEST_TEMPLATES_KEPT = 16;
/** The longest request template kept compiled (model templates run to ~20 k characters). */
const REQUEST_TEMPLATE_KEPT_CHARS = 64 * 1024;

// A template jinja2 parses but the engine here does not is no fault of the request: routed by load (ChatUnrenderable).
function compileRequestTemplate(source: string): ChatTemplate {
  let compiled: PyTemplate;
  try {
    compiled = new PyTemplate(source);
  } catch (err) {
    throw new ChatUnrenderable(`the request's chat template does not compile here: ${(err as Error).message}`);
  }
  return { compiled, contentFormat: detectContentFormat(compiled.ast) };
}

/**
 * The control the encode of a text gets. Its known prefix starts with what the post-processor puts first;
 * a truncation that may drop tokens makes any prefix of the text unknown (the kept ids are cut from the
 * whole), so none is reported then.
 */
function knownPrefixOf(control: EncodeControl | undefined, t: Truncation, prefix: Uint32Array): EncodeControl | undefined {
  const report = control?.knownPrefix;
  if (report === undefined) return control;
  const { knownPrefix: _, ...rest } = control!;
  if (truncates(t)) return rest;
  if (prefix.length === 0) return control;
  return {
    ...rest,
    knownPrefix: (known) => {
      const ids = new Uint32Array(prefix.length + known.ids.length);
      ids.set(prefix);
      ids.set(known.ids, prefix.length);
      report({ ids, unknownChars: known.unknownChars });
    },
  };
}

/**
 * vLLM's ChatParams.with_defaults: the request's template variables over the server's defaults, where a request's
 * null or "auto" leaves the default (merge_kwargs' unset values). vLLM always has defaults to merge with (it adds
 * `tokenize` to the server's), so a request's null or "auto" is dropped even when the server sets none.
 */
function withDefaults(defaults: Record<string, unknown>, request: Record<string, unknown> | undefined): Record<string, unknown> {
  const out = { ...defaults };
  for (const [k, v] of Object.entries(request ?? {})) if (v !== null && v !== "auto") out[k] = v;
  // apply_chat_template takes it as the template (see requestTemplate), not as a variable.
  delete out.chat_template;
  return out;
}
