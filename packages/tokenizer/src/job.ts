// One request's tokenization as a value: what the EPP asks for, in process or through the pool, so both
// paths give the same ids.
import { firstMediaPosition } from "./media";
import { ChatTemplateError, ChatUnrenderable } from "./messages";
import type { EncodeControl } from "./segmenter";
import { keepsTail } from "./truncation";
import type { ChatRules } from "./chat-rules";
import type { ChatMessage, ChatOptions, CompletionOptions, Preprocessor } from "./types";
import { DEFAULT_RESPONSE_ROLE } from "./vllm-chat";
import type { ChatReply } from "./request/chat-reply";
import type { BodyRequest } from "./request/read-body";
import { messageChars } from "./request/routing-job";

/** A completion's text, or a chat (rendered with the model's template). */
export type TokenizeJob =
  | { kind: "prompt"; text: string; opts?: CompletionOptions }
  /**
   * `cutAtMedia`: the ids stop before the first media part (what a router can match; see media.ts). `cut`: the
   * messages stop at the routing bound, so the request's new turn lies past them. `echo`: the request's reply repeats
   * a final message's text before what was generated (vLLM's `echo`, when that message has the reply's role), which
   * its next turn must not repeat.
   */
  | { kind: "chat"; messages: ChatMessage[]; opts: ChatOptions; cutAtMedia?: boolean; cut?: BoundCut; verdict?: RenderVerdict; echo?: true };

type ChatJob = Extract<TokenizeJob, { kind: "chat" }>;

/**
 * Where the routing bound cut a chat's messages (routing-job.ts): inside the request's final message, or before it
 * (the routed messages end on an earlier one, which then renders as any earlier message does).
 */
export type BoundCut = "in-final" | "before-final";

/** The options a chat job renders with: a cut before the final message tells the renderer so. */
export function renderOptions(job: ChatJob): ChatOptions {
  return job.cut === "before-final" ? { ...job.opts, beforeFinal: true } : job.opts;
}

/**
 * Where the encode of a body's chat says why it rendered nothing here (its BodyFields, read with the body): a chat
 * this process cannot render (ChatUnrenderable), or whose cut at the routing bound the template raises on, then has
 * no ids and is routed by load, its cause carried back with the body's fields, to the caller's thread too. Without
 * one, the error is thrown.
 */
export type RenderVerdict = { unrendered?: Unrendered };

/**
 * Why a prompt was not rendered here, though the workers may serve it: `stored_history`, a Responses request
 * continuing a stored response (previous_response_id) whose history only the worker holds; `template_engine`, a
 * chat template the engine here fails on (ChatUnrenderable); `render_bound`, a chat template whose render passed its
 * bound on work (ChatUnrenderable too: jinja2 would finish it, slowly); `responses_rules`, a Responses request to
 * workers whose engine builds its chat in ways not mirrored here (SGLang); `messages_rules`, the same
 * for a /v1/messages request (anthropic-body.ts); `routing_cut`, a chat cut at the routing
 * bound that the template raises on (the cut, not the request, may be at fault: a first part dropped leaves
 * `content: []`).
 */
export type Unrendered = { cause: "stored_history" | "template_engine" | "render_bound" | "responses_rules" | "messages_rules" | "routing_cut"; message: string };

/**
 * A request body as received, for the tokenizer pool: its member reads it (readBody) and tokenizes what it
 * asks for, so the calling thread does neither. `reply`: a background warm of the conversation's next turn
 * after that reply (nextTurnJob), given as the chat completion's response body it came in (JSON or an SSE
 * stream, which the member reads: readChatReply).
 */
export type BodyJob = { kind: "body"; request: BodyRequest; reply?: Uint8Array };

/** What the tokenizer pool takes. */
export type PoolJob = TokenizeJob | BodyJob;

/** What the next turn after a reply is built with: the engine's echo of a final message, and its response role. */
export type ReplyServer = Pick<Preprocessor, "echoed"> & { readonly rules: Pick<ChatRules, "responseRole"> };

/**
 * After a chat's response: the conversation as its next turn will send it, up to where that turn's new text starts
 * (the reply, then a user turn whose text is not known yet; after tool calls, the first call's result, not known
 * either), so that tokenizing it leaves that turn only its new message fresh. Rendered as the next turn, not as
 * "the chat plus its reply": a template may render the final assistant turn differently from an earlier one (Qwen3
 * adds an empty think block). A reply that continued the chat's final message (continue_final_message, in whatever
 * role: the reply takes that message's) comes back as one message with it. The reply's role is the one the server
 * answered with (replyRole); without `pre`, a server's by default. A reply whose response named another role (the
 * EPP's --response-role not the workers') warms nothing.
 */
export function nextTurnJob(job: ChatJob, reply: ChatReply, pre?: ReplyServer): TokenizeJob | undefined {
  // Cut at the routing bound, the next turn is cut at the same place: nothing past it is routed, so none to warm.
  if (job.cut !== undefined) return undefined;
  const answered = withReply(job, reply, pre);
  if (answered === undefined) return undefined;
  const messages = [...answered, nextMessage(reply)];
  return { kind: "chat", messages, opts: { ...job.opts, addGenerationPrompt: true, continueFinalMessage: false } };
}

/**
 * The role vLLM answers a chat with, which the client sends the reply back in: the server's --response-role after a
 * generation prompt, else the final message's own (get_chat_request_role; none for a chat without messages). SGLang's
 * rules read no add_generation_prompt, and their response role is "assistant".
 */
export function replyRole(messages: readonly ChatMessage[], opts: Pick<ChatOptions, "addGenerationPrompt">, responseRole: string): string | undefined {
  return opts.addGenerationPrompt === false ? messages.at(-1)?.role : responseRole;
}

/**
 * The message that follows the reply, its text not known yet: a user's, or the result of the reply's first tool
 * call. After several calls a client sends one result a call, in the calls' order, but the first one's text is where
 * the known prefix ends: the results after it come past text not known, and templates render a result's opening from
 * the messages before it (Qwen3's: a user turn opened by the first, `<tool_response>` before each), so rendering them
 * too would cache nothing more that the next turn finds.
 */
function nextMessage(reply: ChatReply): ChatMessage {
  const calls = Array.isArray(reply.tool_calls) ? (reply.tool_calls as { id?: unknown }[]) : [];
  if (calls.length === 0) return { role: "user", content: "" };
  // Its id too, for a template that renders it (Qwen3's does not).
  const id = calls[0]!.id;
  return typeof id === "string" ? { role: "tool", tool_call_id: id, content: "" } : { role: "tool", content: "" };
}

/**
 * The chat's messages with its reply as the client resends it (see continued). `pre`: what vLLM's echo repeats of a
 * final message of content parts depends on the chat's template (conversation.ts echoedText); without it such a
 * reply is not unechoed.
 */
function withReply(job: ChatJob, generated: ChatReply, pre: ReplyServer | undefined): ChatMessage[] | undefined {
  const last = job.messages.at(-1);
  const responseRole = pre?.rules.responseRole ?? DEFAULT_RESPONSE_ROLE;
  const role = replyRole(job.messages, job.opts, responseRole);
  if (role === undefined || (generated.role !== undefined && generated.role !== role)) return undefined;
  // vLLM echoes the final message when its role is the reply's: the response role's, or any with
  // add_generation_prompt false (the reply then takes that message's role).
  const echoes = job.echo === true && last !== undefined && last.role === role;
  const echoed = { ...generated, role };
  const reply = echoes ? unechoed(echoText(last, job.opts, pre), echoed) : echoed;
  if (reply === undefined) return undefined;
  // The reply continues the final message when it comes in that message's role: always under add_generation_prompt
  // false (the reply takes that role; vLLM refuses continue_final_message without it), and under SGLang's rules (no
  // add_generation_prompt) when that message is an assistant's.
  if (!job.opts.continueFinalMessage || last?.role !== role) return [...job.messages, reply];
  const merged = continued(last, reply);
  return merged && [...job.messages.slice(0, -1), merged];
}

/**
 * What vLLM's `echo` puts before the reply: a final message's text as sent (a string reaches vLLM's conversation as it
 * is, in either content format), or for content parts, as its rules join them (undefined where not mirrored).
 */
function echoText(last: ChatMessage, opts: ChatOptions, pre: ReplyServer | undefined): string | undefined {
  if (last.content === undefined || last.content === null || typeof last.content === "string") return last.content ?? "";
  return pre?.echoed(last, opts);
}

/**
 * The reply without the text that vLLM's `echo` put before it (a stream's first delta, or the front of a JSON reply's
 * content); undefined when that text is not known, or the reply does not start with it: not guessed.
 */
function unechoed(echo: string | undefined, reply: ChatMessage): ChatMessage | undefined {
  if (echo === "") return reply;
  if (echo === undefined || typeof reply.content !== "string" || !reply.content.startsWith(echo)) return undefined;
  return { ...reply, content: reply.content.slice(echo.length) };
}

/**
 * A continued final message (in the reply's role) with the reply joined to it. vLLM renders the message's text without its end
 * of turn and parses the generated text alone for tool calls, so a reply of tool calls only (content null, or "" when
 * streamed) adds its calls to the message and no text: the message's content, parts too, stays as the client sent
 * it. Text is appended to the message's own. Content parts have no one way to take text (a part added, or the last
 * one's text extended, which vLLM joins differently), nor has a message that made calls of its own one way to take
 * more (the render stops at its text, before them): none is guessed.
 */
function continued(last: ChatMessage, reply: ChatMessage): ChatMessage | undefined {
  const text = typeof reply.content === "string" ? reply.content : "";
  if (reply.tool_calls !== undefined) {
    if (Array.isArray(last.tool_calls) && last.tool_calls.length > 0) return undefined;
    if (text === "") return { ...last, tool_calls: reply.tool_calls };
  }
  if (typeof last.content !== "string" || text === "") return undefined;
  return { ...last, ...reply, content: last.content + text };
}

/**
 * A chat's characters from its last reply on (that reply and the turn after it; all of them before a first reply):
 * what the worker that served the conversation most likely does not hold yet. Its cache ends where the reply starts:
 * a template renders an earlier reply otherwise than the model generated it (Qwen3 drops its thinking). A final
 * assistant message (continue_final_message) belongs to the turn. A reply is a message in the server's
 * `responseRole` (ChatRules.responseRole). Undefined for a completion's text, and for a chat cut at the routing
 * bound (its new turn is not among the messages routed).
 */
export function newTurnChars(job: TokenizeJob, responseRole = DEFAULT_RESPONSE_ROLE): number | undefined {
  if (job.kind !== "chat" || job.cut !== undefined) return undefined;
  const ms = job.messages;
  let i = ms.length - 1;
  while (i >= 0 && ms[i]!.role === responseRole) i--;
  while (i >= 0 && ms[i]!.role !== responseRole) i--;
  let n = 0;
  for (let k = Math.max(i, 0); k < ms.length; k++) n += messageChars(ms[k]!);
  return n;
}

export function encodeJob(pre: Preprocessor, job: TokenizeJob, control?: EncodeControl): Uint32Array {
  if (job.kind === "prompt") return pre.encodeCompletion(job.text, job.opts, control);
  const opts = renderOptions(job);
  let ids: Uint32Array;
  try {
    ids = pre.encodeChat(job.messages, opts, control);
  } catch (err) {
    const cause = err instanceof ChatUnrenderable ? err.reason : err instanceof ChatTemplateError && job.cut !== undefined ? "routing_cut" : undefined;
    if (cause === undefined || job.verdict === undefined) throw err;
    // By load: ids of a prompt rendered otherwise than vLLM renders it would follow another prompt's cache, and an
    // error the cut raises is not the request's to answer with a 400.
    job.verdict.unrendered = { cause, message: (err as Error).message };
    return new Uint32Array(0);
  }
  if (!job.cutAtMedia) return ids;
  // vLLM's blocks from an image or audio part on carry the item's identifier, which a router cannot
  // compute: the ids end before the first such part.
  const media = firstMediaPosition(pre, job.messages, opts);
  if (media === undefined) return ids;
  // The position counts tokens before truncation; keeping the tail drops some in front of it.
  const dropped = keepsTail(opts) ? pre.encodeChat(job.messages, { ...opts, truncatePromptTokens: undefined }).length - ids.length : 0;
  return ids.subarray(0, Math.max(0, media - dropped));
}
