import { Tokenizer } from "@huggingface/tokenizers";
import type { ChatRules, ChatServer } from "./chat-rules";
import type { ChatTemplate } from "./chat-template";
import type { ContentFormatOption } from "./content-format";
import { ChatTemplateError, ChatUnrenderable } from "./messages";
import { vocabIdOf } from "./fast/bpe-model";
import { compileFastTokenizer } from "./fast/fast-tokenizer";
import { postProcessorAdditions } from "./post-processor";
import { PyTemplate } from "./py-template";
import { truncatePrompt, truncates, type Truncation } from "./truncation";
import { Lru } from "./lru";
import { SegmentCache } from "./segment-cache";
import type { ConversationTemplate } from "./sglang-conversation";
import { Segmenter, type EncodeControl, type SectionEncoder } from "./segmenter";
import { pickChatTemplate, tokenContent, type TokenizerFiles } from "./tokenizer-files";
import { type CacheOptions, type CacheStats, type ChatMessage, type ChatOptions, type CompletionOptions, type Preprocessor } from "./types";

/**
 * A Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) with its chat template and segment cache. Chats
 * render by the workers' engine's rules (`rules`), with the templates and flags it holds (a ChatServer).
 */
export class HfPreprocessor implements Preprocessor, ChatServer {
  readonly kind = "hf" as const;
  // Built on first use: decode, and encoding only when the fast BPE does not implement the tokenizer.
  private library: Tokenizer | null = null;
  private readonly files: TokenizerFiles;
  // Each named template compiled once, on the first request that picks it (see pickChatTemplate).
  private readonly templates = new Map<string, ChatTemplate>();
  // Templates requests bring (--trust-request-chat-template), compiled once per text while they stay in use.
  private readonly requestTemplates = new Lru<string, ChatTemplate>(REQUEST_TEMPLATES_KEPT);
  readonly specialTokens: Record<string, unknown>;
  private readonly encoder: SectionEncoder;
  private readonly segmenter: Segmenter;
  private readonly cache: SegmentCache;
  // What the model's post-processor adds around a single text (e.g. [bos] before it), learned once by probing.
  private readonly completionPrefix: Uint32Array;
  private readonly completionSuffix: Uint32Array;
  // The bos token's id: SGLang drops it from the front of a continued final message's ids.
  private readonly bosId: number | undefined;

  constructor(
    files: TokenizerFiles,
    cache: CacheOptions | false,
    fastBpe = true,
    readonly flags: ServerRendering = {},
    // Settled once after construction, by a probe that renders with this preprocessor (createPreprocessor).
    public rules: ChatRules,
  ) {
    const { tokenizerJson, config } = files;
    this.files = files;
    // transformers hands the template the tokenizer's special tokens that are set (special_tokens_map).
    this.specialTokens = {};
    for (const name of SPECIAL_TOKEN_NAMES) {
      const content = tokenContent(config[name] as Parameters<typeof tokenContent>[0]);
      if (content !== null) this.specialTokens[name] = content;
    }
    if (config.additional_special_tokens?.length) this.specialTokens.additional_special_tokens = config.additional_special_tokens.map(tokenContent);
    this.encoder = sectionEncoder(() => this.tokenizer, tokenizerJson, fastBpe);
    this.segmenter = new Segmenter(this.encoder, tokenizerJson.added_tokens, tokenizerJson.normalizer != null, cache === false ? undefined : cache.pieceChars);
    // Without a cache the text is still walked piece by piece (into a cache that keeps nothing): its known prefix
    // is told, it stops when asked, and its fresh tokens are counted, as with one.
    this.cache = new SegmentCache(cache === false ? { maxBytes: 0 } : cache);
    [this.completionPrefix, this.completionSuffix] = this.probeSpecialTokenRules(files);
    const bos = tokenContent(config.bos_token as Parameters<typeof tokenContent>[0]);
    this.bosId = bos === null ? undefined : tokenId(tokenizerJson, bos);
  }

  template(hasTools: boolean): ChatTemplate | null {
    const given = this.flags.chatTemplate;
    if (given !== undefined) return this.compiled("--chat-template", given);
    const picked = pickChatTemplate(this.files.chatTemplate, hasTools);
    return picked === null ? null : this.compiled(`tokenizer:${picked.name}`, picked.source);
  }

  get processorTemplate(): ChatTemplate | null {
    const source = this.files.processorChatTemplate;
    return source === null ? null : this.compiled("processor", source);
  }

  /** The tokenizer's template of that name (get_chat_template's lookup), when its templates are several. */
  private namedTemplate(name: string): ChatTemplate | null {
    const t = this.files.chatTemplate;
    return t !== null && typeof t !== "string" && Object.hasOwn(t, name) ? this.compiled(`tokenizer:${name}`, t[name]!) : null;
  }

  // Keyed by where the template comes from: a tokenizer's template may be named anything.
  private compiled(key: string, source: string): ChatTemplate {
    let t = this.templates.get(key);
    if (t === undefined) this.templates.set(key, (t = this.compile(source)));
    return t;
  }

  get namedTemplates(): boolean {
    return this.flags.chatTemplate === undefined && this.files.chatTemplate !== null && typeof this.files.chatTemplate !== "string";
  }

  private compile(source: string): ChatTemplate {
    const compiled = new PyTemplate(source, this.flags.renderBoundScale);
    return { source, compiled, contentFormat: this.rules.detectFormat(source, compiled.ast) };
  }

  /**
   * The template a request brings, as vLLM takes it: refused (400) unless --trust-request-chat-template
   * (validate_chat_template); trusted, its `chat_template` wins, then the server's --chat-template, then its
   * chat_template_kwargs' own (ChatParams.get_apply_chat_template_kwargs, where an unset value or "auto" does not
   * count), the tokenizer's template of that name if it has one. Null: the server's template renders it.
   */
  requestTemplate(opts: ChatOptions): ChatTemplate | null {
    const inKwargs = opts.templateKwargs?.chat_template;
    if (opts.chatTemplate === undefined && (inKwargs === undefined || inKwargs === null)) return null;
    if (!this.flags.trustRequestChatTemplate) throw new ChatTemplateError(UNTRUSTED_TEMPLATE);
    const fromKwargs = inKwargs === null || inKwargs === "auto" ? undefined : inKwargs;
    const source = opts.chatTemplate || this.flags.chatTemplate || fromKwargs;
    if (source === undefined || source === this.flags.chatTemplate) return null;
    if (typeof source !== "string") throw new ChatTemplateError("chat_template_kwargs.chat_template must be a string");
    // resolve_chat_template asks the tokenizer first: a name among its templates (e.g. "tool_use") is that template.
    const named = this.namedTemplate(source);
    if (named !== null) return named;
    // A large one is compiled for its request and not kept: 16 of a body's size each would hold megabytes.
    if (source.length > REQUEST_TEMPLATE_KEPT_CHARS) return this.compileRequestTemplate(source);
    return this.requestTemplates.get(source) ?? this.requestTemplates.set(source, this.compileRequestTemplate(source));
  }

  // A template jinja2 parses but the engine here does not is no fault of the request: routed by load (ChatUnrenderable).
  private compileRequestTemplate(source: string): ChatTemplate {
    try {
      return this.compile(source);
    } catch (err) {
      throw new ChatUnrenderable(`the request's chat template does not compile here: ${(err as Error).message}`);
    }
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
    const { text, continuation } = this.rules.render(messages, opts, this);
    return continuation === undefined ? text : text + continuation;
  }

  echoed(message: ChatMessage, opts: ChatOptions): string | undefined {
    return this.rules.echoed?.(message, opts, this);
  }

  encodeChat(messages: readonly ChatMessage[], opts: ChatOptions = {}, control?: EncodeControl): Uint32Array {
    // vLLM tokenizes the rendered chat with the request's add_special_tokens, false by default: the template
    // already placed them (true on a template that starts with bos gives two).
    const add = opts.addSpecialTokens ?? false;
    const { text, continuation } = this.rules.render(messages, opts, this);
    const body = this.encodeText(text, knownPrefixOf(control, opts, add ? this.completionPrefix : EMPTY));
    return this.withSpecialTokens(continuation === undefined ? body : concat(body, this.encodeContinuation(continuation)), add, opts);
  }

  /**
   * SGLang's continued final message (_append_assistant_prefix_to_prompt_ids): tokenized on its own with the
   * tokenizer's special tokens, less a leading bos, after the rendered chat's ids.
   */
  private encodeContinuation(text: string): Uint32Array {
    let prefix = this.completionPrefix;
    if (prefix.length > 0 && prefix[0] === this.bosId) prefix = prefix.subarray(1);
    const body = this.encodeText(text);
    return concat(concat(prefix, body), this.completionSuffix);
  }

  // What the tokenizer's post-processor adds when asked to, and truncate_prompt_tokens applied around it.
  private withSpecialTokens(body: Uint32Array, add: boolean, opts: CompletionOptions): Uint32Array {
    return add ? truncatePrompt(body, opts, this.completionPrefix, this.completionSuffix) : truncatePrompt(body, opts);
  }

  /** The ids of the special tokens set and of every added token (transformers' all_special_ids and get_added_vocab). */
  get markerIds(): ReadonlySet<number> {
    const { tokenizerJson, config } = this.files;
    const ids = new Set(tokenizerJson.added_tokens.map((t) => t.id));
    const named = [...SPECIAL_TOKEN_NAMES.map((n) => config[n]), ...(config.additional_special_tokens ?? [])];
    for (const token of named) {
      const content = tokenContent(token as Parameters<typeof tokenContent>[0]);
      const id = content === null ? undefined : tokenId(tokenizerJson, content);
      if (id !== undefined) ids.add(id);
    }
    return ids;
  }

  decode(ids: ArrayLike<number>): string {
    return ids.length === 0 ? "" : this.tokenizer.decode(Array.from(ids), { skip_special_tokens: false });
  }

  cacheStats(): CacheStats {
    return this.cache.stats();
  }

  resetCache(): void {
    this.cache.clear();
  }

  private encodeText(text: string, control?: EncodeControl): Uint32Array {
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
  return json.added_tokens.find((t) => t.content === content)?.id ?? vocabIdOf(json.model as Record<string, unknown> | undefined, content);
}

const EMPTY = new Uint32Array(0);
const SPECIAL_TOKEN_NAMES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"] as const;

/**
 * What the server's flags change in the chats it renders (see PreprocessorOptions); SGLang's rules read only its
 * chatTemplate and conversationTemplate, vLLM's all but conversationTemplate. --default-chat-template-kwargs, vLLM's
 * --exclude-tools-when-tool-choice-none and --response-role are in the rules (chatRules).
 */
export type ServerRendering = {
  /** --chat-template, loaded (the template's text). */
  chatTemplate?: string;
  /** SGLang's conversation template, which every chat renders with in place of a Jinja template (not mirrored). */
  conversationTemplate?: ConversationTemplate;
  /** How vLLM renders this model's chats when not with a Jinja template (vllm-renderers.ts; not mirrored). */
  otherRenderer?: string;
  /** --chat-template-content-format. */
  contentFormat?: ContentFormatOption;
  trustRequestChatTemplate?: boolean;
  /** PreprocessorOptions.renderBoundScale. */
  renderBoundScale?: number;
};

/** vLLM's answer (400) to a request that brings a template the server does not trust. */
const UNTRUSTED_TEMPLATE =
  "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.";

/** Request templates kept compiled: a client sends one or a few; a client varying it per request pays a compile each. */
const REQUEST_TEMPLATES_KEPT = 16;
/** The longest request template kept compiled (model templates run to ~20 k characters). */
const REQUEST_TEMPLATE_KEPT_CHARS = 64 * 1024;

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
  // The first report's ids follow the prefix; the later ones add to them.
  let first = true;
  return {
    ...rest,
    knownPrefix: (known) => {
      let added = known.added;
      if (first) {
        added = new Uint32Array(prefix.length + known.added.length);
        added.set(prefix);
        added.set(known.added, prefix.length);
        first = false;
      }
      report({ added, tokens: prefix.length + known.tokens, unknownChars: known.unknownChars });
    },
  };
}

function concat(a: Uint32Array, b: Uint32Array): Uint32Array {
  if (b.length === 0) return a;
  const out = new Uint32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}
