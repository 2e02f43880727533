// Undefined values as jinja2's default Undefined (transformers' ImmutableSandboxedEnvironment sets no other), each
// expectation what jinja2 3.1 gives.
import { describe, expect, test } from "bun:test";
import { PyTemplate, TemplateRaised } from "../src/py-template";

const render = (source: string, vars: Record<string, unknown> = {}) => new PyTemplate(source).render(vars);

describe("an undefined value", () => {
  test("prints as nothing, is not defined, and an attribute of None is one", () => {
    expect(render("[{{ x }}]")).toBe("[]");
    expect(render("{{ x is defined }}")).toBe("False");
    expect(render("[{{ n.a }}]", { n: null })).toBe("[]");
    expect(render("[{{ d.a }}]", { d: {} })).toBe("[]");
  });

  test("raises UndefinedError when an attribute or item of it is read", () => {
    expect(() => render("{{ x.a }}")).toThrow(TemplateRaised);
    expect(() => render("{{ x['a'] }}")).toThrow(TemplateRaised);
    expect(() => render("{{ d.a.b }}", { d: {} })).toThrow(TemplateRaised);
    expect(() => render("{{ n.a.b }}", { n: null })).toThrow(TemplateRaised);
    expect(() => render("{{ l[3].b }}", { l: [1] })).toThrow(TemplateRaised);
    // The attribute is read before the test: jinja2 raises on `x.a is defined` too.
    expect(() => render("{{ x.a is defined }}")).toThrow(TemplateRaised);
  });

  test("raises json.dumps' TypeError through tojson, where it printed null", () => {
    expect(() => render("{{ x | tojson }}")).toThrow(TemplateRaised);
    expect(() => render("{{ t.name | tojson }}", { t: { function: { name: "f" } } })).toThrow(TemplateRaised);
    expect(render("{{ n | tojson }} {{ d.get('z') | tojson }}", { n: null, d: {} })).toBe("null null");
  });
});
