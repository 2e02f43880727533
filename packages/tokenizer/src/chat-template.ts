import type { ContentFormat } from "./content-format";
import { ChatTemplateError, ChatUnrenderable } from "./messages";
import { RenderBoundExceeded, TemplateRaised, type PyTemplate } from "./py-template";

/** A chat template compiled once, with the content format the engine's rules detect on it. */
export type ChatTemplate = { source: string; compiled: PyTemplate; contentFormat: ContentFormat };

/**
 * Renders `template` with `vars`. What jinja2 raises too (raise_exception(), an undefined value's attribute or
 * tojson) is the request's doing: a 400, as both engines answer a jinja2 error. Any other failure may be this
 * process's (jinja2 renders what @huggingface/jinja cannot), and so is a render stopped at its bound (jinja2 would
 * finish it): no reason to refuse the request, so it is ChatUnrenderable (routed by load).
 */
export function runTemplate(template: ChatTemplate, vars: Record<string, unknown>): string {
  try {
    return template.compiled.render(vars);
  } catch (err) {
    if (err instanceof TemplateRaised) throw new ChatTemplateError(`chat template failed: ${err.message}`);
    if (err instanceof RenderBoundExceeded) throw new ChatUnrenderable(err.message, "render_bound");
    throw new ChatUnrenderable(`chat template failed here: ${(err as Error).message}`);
  }
}
