import type { ContentFormat } from "./content-format";
import { ChatTemplateError, ChatUnrenderable } from "./messages";
import { TemplateRaised, type PyTemplate } from "./py-template";

/** A chat template compiled once, with the content format the engine's rules detect on it. */
export type ChatTemplate = { compiled: PyTemplate; contentFormat: ContentFormat };

/**
 * Renders `template` with `vars`. raise_exception() in the template is the request's doing: a 400, as the engines
 * answer it. Any other failure may be this process's (jinja2 renders what @huggingface/jinja cannot): no reason to
 * refuse the request, so it is ChatUnrenderable (routed by load).
 */
export function runTemplate(template: ChatTemplate, vars: Record<string, unknown>): string {
  try {
    return template.compiled.render(vars);
  } catch (err) {
    if (err instanceof TemplateRaised) throw new ChatTemplateError(`chat template failed: ${err.message}`);
    throw new ChatUnrenderable(`chat template failed here: ${(err as Error).message}`);
  }
}
