// The messages a chat template sees, rebuilt from the request's as vLLM rebuilds them
// (vllm/entrypoints/chat_utils.py: `_parse_chat_message_content`, `_parse_chat_message_content_part`,
// `_postprocess_messages`). Each message is made anew from the fields vLLM knows, so anything else a client
// sends (ids, vendor fields) never reaches the template. A chat completion's deprecated `reasoning_content` was
// renamed `reasoning` when its body was read (openai-body.ts chatMessages), as vLLM's request validator does.
import type { ContentFormat } from "./content-format";
import { ChatTemplateError } from "./messages";
import { isPyDict, parseJsonKeepingFloats } from "./py-values";
import type { ChatMessage, ContentPart } from "./types";

type Part = { type: string; text?: string; name?: string };

// Content part types whose payload is text, and the field it is in (vLLM's MM_PARSER_MAP).
const TEXT_FIELD: Record<string, string> = { text: "text", input_text: "text", output_text: "text", refusal: "refusal", thinking: "thinking" };
// Media part types and the modality the "openai" format names them by.
const MEDIA: Record<string, string> = {
  image_url: "image", input_image: "image", image_pil: "image", image_embeds: "image",
  audio_url: "audio", input_audio: "audio", audio_embeds: "audio", video_url: "video",
};
// Without a `type` (or with a `uuid`), vLLM finds the kind by these keys, in this order.
const UNTYPED_KEYS = ["image_url", "image_pil", "image_embeds", "audio_embeds", "audio_url", "input_audio", "video_url", "tool_reference"];

/** The field of a content part that holds its text, or undefined for a part of another kind. */
export function textField(part: ContentPart): string | undefined {
  return typeof part.type === "string" && Object.hasOwn(TEXT_FIELD, part.type) ? TEXT_FIELD[part.type] : undefined;
}

/** One content part as vLLM parses it: text, a media placeholder, a tool reference, or nothing (skipped). */
function parsePart(part: unknown): { text: string } | { media: string } | { toolReference: string } | null {
  if (typeof part === "string") return { text: part };
  const p = part as ContentPart & Record<string, unknown>;
  let type: unknown = p.type;
  if (type === undefined || type === null || (p.uuid !== undefined && p.uuid !== null)) {
    type = UNTYPED_KEYS.find((k) => k in p && (k !== "input_audio" || (p[k] !== undefined && p[k] !== null)));
    if (type === undefined) throw new ChatTemplateError("Missing 'type' field in multimodal part.");
  }
  if (typeof type !== "string") throw new ChatTemplateError("Invalid 'type' field in multimodal part.");
  const field = TEXT_FIELD[type];
  if (field !== undefined) {
    const text = p[field];
    // A part without its text is skipped (vLLM warns for text and refusal parts, and fails on the others).
    return text === undefined || text === null ? null : { text: String(text) };
  }
  if (type === "tool_reference") return { toolReference: String(p.name ?? p.tool_reference ?? "") };
  const modality = MEDIA[type];
  if (modality === undefined) throw new ChatTemplateError(`Unsupported chat content part type: '${type}'.`);
  return { media: modality };
}

type Parsed = NonNullable<ReturnType<typeof parsePart>>;

/** A message's content parts as vLLM parses them, those it skips left out. */
function parsedParts(role: string, content: unknown): Parsed[] {
  let parts = content === undefined || content === null ? [] : typeof content === "string" ? [content] : (content as unknown[]);
  if (role === "system") parts = withoutBillingHeader(parts);
  return parts.map(parsePart).filter((p) => p !== null);
}

function contentOf(parsed: Parsed[], format: ContentFormat): string | Part[] {
  if (format === "openai") {
    return parsed.map((p): Part => ("text" in p ? { type: "text", text: p.text } : "media" in p ? { type: p.media } : { type: "tool_reference", name: p.toolReference }));
  }
  // The "string" format: text parts joined by newlines; media leave nothing for a text tokenizer (a multimodal
  // model's processor inserts its placeholders, see media.ts). An empty text is no part (vLLM keeps only truthy
  // parse results), so it adds no newline.
  return parsed.flatMap((p) => ("text" in p ? [p.text] : "toolReference" in p ? [p.toolReference] : [])).filter((t) => t !== "").join("\n");
}

/**
 * The text vLLM's `echo` repeats of a message (the final one) before the reply: its content as the template got it,
 * a list of parts joined by newlines (serving.py, chat_completion_full_generator). In the "string" format that is
 * the text parts' texts (text, input_text, output_text, refusal, thinking, bare strings; a tool reference's name),
 * empty ones dropped, joined by newlines; in the "openai" format every text part's text, empty ones kept. Undefined
 * where it is not mirrored: a "string" message with media, to whose text vLLM adds the model's placeholders (not
 * known to a text tokenizer), and an "openai" one with a part that has no text (media, a tool reference), on which
 * vLLM fails the request (`msg["text"]`). A stream sends the same text as its first delta in the "string" format; in
 * the "openai" format it sends none (chat_completion_stream_generator hands the list of parts, a string's one part
 * too, to a delta typed a string): the stream carries an error chunk there, and no reply is warmed from it.
 */
export function echoedText(message: ChatMessage, format: ContentFormat): string | undefined {
  const parsed = parsedParts(message.role, message.content);
  if (format === "string") return parsed.some((p) => "media" in p) ? undefined : (contentOf(parsed, format) as string);
  const texts = parsed.flatMap((p) => ("text" in p ? [p.text] : []));
  return texts.length === parsed.length ? texts.join("\n") : undefined;
}

const BILLING_HEADER = "x-anthropic-billing-header";

/**
 * A system message's parts without Claude Code's attribution line, as vLLM drops it
 * (_strip_claude_code_billing_header): a text part (a string, or of type "text") that starts with
 * `x-anthropic-billing-header` keeps only what follows its first newline, and goes when nothing does. Its `cch`
 * value changes on every request, so a prompt keeping it would share no block past it.
 */
function withoutBillingHeader(parts: unknown[]): unknown[] {
  return parts.flatMap((part) => {
    const p = part as ContentPart;
    const text = typeof part === "string" ? part : typeof part === "object" && part !== null && p.type === "text" ? p.text : undefined;
    if (typeof text !== "string" || !text.startsWith(BILLING_HEADER)) return [part];
    const newline = text.indexOf("\n");
    const rest = newline < 0 ? "" : text.slice(newline + 1);
    if (rest === "") return [];
    return [typeof part === "string" ? rest : { ...p, text: rest }];
  });
}

/** The conversation vLLM hands to the chat template for these request messages. */
export function conversation(messages: readonly ChatMessage[], format: ContentFormat): ChatMessage[] {
  return messages.map((m) => {
    const out: ChatMessage = { role: m.role, content: contentOf(parsedParts(m.role, m.content), format) };
    if (m.role === "assistant") {
      if (m.tool_calls !== undefined && m.tool_calls !== null) out.tool_calls = toolCalls(m.tool_calls);
      // vLLM's response field is `reasoning`; templates read `reasoning_content` (the older name), so both.
      if (m.reasoning !== undefined && m.reasoning !== null) {
        out.reasoning = m.reasoning;
        out.reasoning_content = m.reasoning;
      }
    } else if (m.role === "tool") {
      if ("tool_call_id" in m) out.tool_call_id = m.tool_call_id;
      // Tool results sent as text parts reach the template as one string, even in the "openai" format.
      if (Array.isArray(out.content)) {
        const parts = out.content as Part[];
        if (parts.every((p) => p.type === "text")) out.content = parts.map((p) => p.text ?? "").join("\n");
      }
    }
    if (typeof m.name === "string") out.name = m.name;
    if (typeof m.task === "string") out.task = m.task;
    if (m.role === "developer") out.tools = m.tools ?? null;
    if (Array.isArray(out.tool_calls) && out.tool_calls.length === 0) delete out.tool_calls;
    return out;
  });
}

/**
 * An assistant's tool calls with `function.arguments` as vLLM's _postprocess_messages leaves them: always a mapping,
 * as chat templates require. An object is kept, a JSON string parsed (Python's json, floats kept); empty, malformed,
 * or anything that is not a JSON object (an array, a number) becomes {}. A call that is no object, or not of type
 * "function", is refused as vLLM refuses it.
 */
function toolCalls(calls: unknown): unknown {
  if (!Array.isArray(calls)) return calls;
  return calls.map((call) => {
    if (typeof call !== "object" || call === null || Array.isArray(call)) throw new ChatTemplateError("assistant tool_calls entries must be objects.");
    const { type = "function", function: fn } = call as { type?: unknown; function?: unknown };
    if (type !== "function" || !isPyDict(fn)) throw new ChatTemplateError("chat completions only support assistant tool_calls of type 'function'.");
    let parsed: unknown = fn.arguments;
    if (typeof parsed === "string") {
      try {
        parsed = parseJsonKeepingFloats(parsed);
      } catch {
        parsed = {};
      }
    }
    return { ...call, function: { ...fn, arguments: isPyDict(parsed) ? parsed : {} } };
  });
}
