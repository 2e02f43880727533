import type { Context } from "hono";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import type { z } from "zod";

/** OpenAI-style error body, with the `type` names vLLM uses. */
export function openAiError(c: Context, status: ContentfulStatusCode, message: string, param: string | null = null) {
  const type = status === 400 ? "BadRequestError" : status === 404 ? "NotFoundError" : "InternalServerError";
  return c.json({ error: { message, type, param, code: status } }, status);
}

/** The first zod issue as an OpenAI 400: names the offending field in `param`. */
export function validationError(c: Context, error: z.ZodError) {
  const issue = error.issues[0]!;
  const param = issue.path.length > 0 ? issue.path.join(".") : null;
  return openAiError(c, 400, param ? `${param}: ${issue.message}` : issue.message, param);
}

/** Reads and validates a JSON body, or yields the 400 response to return (bad JSON or a bad field). */
export async function parseBody<S extends z.ZodType>(c: Context, schema: S): Promise<{ ok: true; data: z.output<S> } | { ok: false; res: Response }> {
  let body: unknown;
  try {
    body = await c.req.json();
  } catch (e) {
    return { ok: false, res: openAiError(c, 400, `request body is not valid JSON: ${(e as Error).message}`) };
  }
  const parsed = schema.safeParse(body);
  return parsed.success ? { ok: true, data: parsed.data } : { ok: false, res: validationError(c, parsed.error) };
}
