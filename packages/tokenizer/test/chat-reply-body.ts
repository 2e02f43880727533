import type { ChatMessage } from "../src/index";

/** A chat completion's JSON response body whose one choice is `reply`: what a warm's BodyJob.reply carries. */
export const chatReplyBody = (reply: ChatMessage): Uint8Array =>
  new TextEncoder().encode(JSON.stringify({ object: "chat.completion", choices: [{ index: 0, message: reply, finish_reason: "stop" }] }));
