import { expect, test } from "bun:test";
import { createPreprocessor, firstMediaPosition, mediaPositions } from "../src/index";

const pre = await createPreprocessor({});
const image = { type: "image_url", image_url: { url: "https://example.com/cat.png" } };

test("a media part's position is where the text-only chat and the chat cut before it stop agreeing", () => {
  const messages = [
    { role: "system", content: "You are a helpful assistant that describes pictures." },
    { role: "user", content: [{ type: "text", text: "What is in this picture? Describe it" }, image, { type: "text", text: "in detail." }] },
  ];
  const full = pre.encodeChat(messages);
  const [pos] = mediaPositions(pre, messages);
  const text = pre.decode(full.subarray(0, pos!.at));
  expect(text.endsWith("Describe it") || text.endsWith("Describe")).toBe(true);
  expect(pos).toMatchObject({ message: 1, part: 1 });
  expect(firstMediaPosition(pre, messages)).toBe(pos!.at);
});

test("text-only chats have no media; a second part never comes before the first", () => {
  expect(firstMediaPosition(pre, [{ role: "user", content: "hi" }])).toBeUndefined();
  const two = mediaPositions(pre, [{ role: "user", content: [image, { type: "text", text: "and" }, { type: "input_audio", input_audio: { data: "AAAA", format: "wav" } }] }]);
  expect(two.length).toBe(2);
  expect(two[1]!.at).toBeGreaterThanOrEqual(two[0]!.at);
});

test("the first media part's position costs two renders, however many parts follow it", () => {
  let renders = 0;
  const counting = { ...pre, encodeChat: (...args: Parameters<typeof pre.encodeChat>) => (renders++, pre.encodeChat(...args)) };
  const messages = [{ role: "user", content: [{ type: "text", text: "look" }, ...Array.from({ length: 50 }, () => image)] }];
  expect(firstMediaPosition(counting, messages)).toBe(mediaPositions(pre, messages)[0]!.at);
  expect(renders).toBe(2);
});
