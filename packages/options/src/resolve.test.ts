import { describe, expect, test } from "bun:test";
import { z } from "zod";
import { optionsMarkdown, usageText, withOptionsSection } from "./help.ts";
import { count, group, jsonObjectText, opt, port } from "./option.ts";
import { ConfigError, resolveOptions } from "./resolve.ts";

const SPEC = {
  ...group("Servers", {
    grpcPort: opt.int(port.default(9002), "ext_proc port"),
    secure: opt.bool(z.boolean().default(true), "TLS", { env: "LEGACY_SECURE" }),
    bodyMode: opt.choice(["auto", "buffered"], "auto", "body mode"),
  }),
  ...group("Routing", {
    weight: opt.number(z.number().min(0).default(1), "a weight"),
    adapters: opt.list(z.array(z.string()).default([]), "adapter names"),
    budget: opt.int(count.optional(), "an optional budget"),
  }),
};
const PROGRAM = { envPrefix: "APP_" };
const file = (values: Record<string, unknown>) => ({ label: `--config "app.yaml"`, values });
const resolve = (argv: string[], env: Record<string, string> = {}, values?: Record<string, unknown>) =>
  resolveOptions(SPEC, PROGRAM, { argv, env, file: values && file(values) });

describe("one rule: flag > environment variable > config file > default", () => {
  test("the default stands when no source gives the option", () => {
    expect(resolve([]).values).toEqual({ grpcPort: 9002, secure: true, bodyMode: "auto", weight: 1, adapters: [], budget: undefined });
    expect(resolve([]).source("grpcPort")).toBe("--grpc-port default");
  });

  test("the config file wins over the default", () => {
    const r = resolve([], {}, { grpcPort: 7000, weight: 2.5, adapters: ["a", "b"] });
    expect(r.values).toMatchObject({ grpcPort: 7000, weight: 2.5, adapters: ["a", "b"] });
    expect(r.source("grpcPort")).toBe(`grpcPort in --config "app.yaml"`);
  });

  test("the environment variable wins over the config file", () => {
    const r = resolve([], { APP_GRPC_PORT: "7100", LEGACY_SECURE: "false", APP_ADAPTERS: "x, y,," }, { grpcPort: 7000, secure: true, adapters: ["a"] });
    expect(r.values).toMatchObject({ grpcPort: 7100, secure: false, adapters: ["x", "y"] });
    expect(r.source("grpcPort")).toBe("APP_GRPC_PORT (--grpc-port)");
  });

  test("the flag wins over the environment variable and the file", () => {
    const r = resolve(["--grpc-port", "7200", "--weight=0.5"], { APP_GRPC_PORT: "7100", APP_WEIGHT: "3" }, { grpcPort: 7000, weight: 2 });
    expect(r.values).toMatchObject({ grpcPort: 7200, weight: 0.5 });
    expect(r.source("grpcPort")).toBe("--grpc-port");
  });

  test("an empty variable is an unset one", () => {
    expect(resolve([], { APP_GRPC_PORT: "" }, { grpcPort: 7000 }).values.grpcPort).toBe(7000);
  });

  test("a bare boolean flag means true; booleans read true/false, 1/0, yes/no", () => {
    expect(resolve(["--secure"], { LEGACY_SECURE: "false" }).values.secure).toBe(true);
    expect(resolve(["--secure", "--grpc-port", "1"]).values).toMatchObject({ secure: true, grpcPort: 1 });
    expect(resolve(["--secure", "no"]).values.secure).toBe(false);
    // A negative number is a value, not a flag (and then refused by the schema).
    expect(() => resolve(["--weight", "-1.5", "--secure"])).toThrow('invalid value for --weight: "-1.5"');
    expect(resolve([], { LEGACY_SECURE: "0" }).values.secure).toBe(false);
  });

  test("a string in the file is read as a flag's text would be (YAML's \"9002\")", () => {
    expect(resolve([], {}, { grpcPort: "7300", secure: "yes" }).values).toMatchObject({ grpcPort: 7300, secure: true });
  });

  test("a positional argument goes to the option named for it", () => {
    const r = resolveOptions(group("Input", { trace: opt.string(z.string().default("t.jsonl"), "trace") }), { positional: "trace" }, { argv: ["my.jsonl"] });
    expect(r.values.trace).toBe("my.jsonl");
  });

  test("a program without a prefix reads flags only", () => {
    expect(resolveOptions(SPEC, {}, { argv: [], env: { APP_GRPC_PORT: "1", GRPC_PORT: "2" } }).values.grpcPort).toBe(9002);
  });
});

describe("a bad value names its source and its text", () => {
  test.each([
    [["--grpc-port", "70000"], {}, undefined, /^invalid value for --grpc-port: "70000" \(.*65535/],
    [["--grpc-port", "0x10"], {}, undefined, /--grpc-port: "0x10" \(expected an integer\)/],
    [["--grpc-port="], {}, undefined, /--grpc-port: "" \(expected an integer\)/],
    [["--weight", " "], {}, undefined, /--weight: " " \(expected a number\)/],
    [["--weight=-1"], {}, undefined, /--weight: "-1"/],
    [["--secure", "maybe"], {}, undefined, /--secure: "maybe" \(expected true\|false\)/],
    [["--body-mode", "sideways"], {}, undefined, /--body-mode: "sideways" \(expected auto\|buffered\)/],
    [[], { APP_GRPC_PORT: "http" }, undefined, /APP_GRPC_PORT \(--grpc-port\): "http"/],
    [[], { LEGACY_SECURE: "nah" }, undefined, /LEGACY_SECURE \(--secure\): "nah"/],
    [[], {}, { grpcPort: -1 }, /grpcPort in --config "app.yaml": -1/],
    [[], {}, { bodyMode: 3 }, /bodyMode in --config "app.yaml": 3/],
    [[], {}, { grpcPrt: 1 }, /unknown option "grpcPrt" in --config "app.yaml"/],
    [["--frobnicate", "1"], {}, undefined, /unknown argument "--frobnicate"/],
    [["--grpc-port"], {}, undefined, /--grpc-port needs a value/],
    [["--grpc-port", "--secure"], {}, undefined, /--grpc-port needs a value/],
    [["stray"], {}, undefined, /unexpected argument "stray"/],
  ] as const)("argv %p, environment %j, file %j is refused", (argv, env, values, message) => {
    const attempt = () => resolve([...argv], env as Record<string, string>, values as Record<string, unknown> | undefined);
    expect(attempt).toThrow(ConfigError);
    expect(attempt).toThrow(message);
  });

  test("a rule across options names the source of the value it refuses", () => {
    expect(() => resolve([], { APP_GRPC_PORT: "9" }).fail("grpcPort", "expected more")).toThrow('invalid value for APP_GRPC_PORT (--grpc-port): "9" (expected more)');
    expect(() => resolve([]).fail("grpcPort", "expected more")).toThrow("invalid value for --grpc-port default: 9002 (expected more)");
  });

  test("an option without a default must be given", () => {
    const spec = group("Servers", { listen: opt.string(z.string().min(1), "address") });
    expect(() => resolveOptions(spec, {}, { argv: [] })).toThrow("--listen is required");
  });
});

describe("help and docs come from the spec", () => {
  test("--help lists every option under its section, with its variable and default", () => {
    const text = usageText(SPEC, { ...PROGRAM, command: "app" });
    expect(text.indexOf("Servers:")).toBeLessThan(text.indexOf("--grpc-port"));
    expect(text.indexOf("--body-mode")).toBeLessThan(text.indexOf("Routing:"));
    expect(text).toContain("--grpc-port N  (APP_GRPC_PORT, default 9002)");
    expect(text).toContain("--secure [BOOL]  (LEGACY_SECURE, default true)");
    expect(text).toContain("--body-mode auto|buffered  (APP_BODY_MODE, default \"auto\")");
    expect(text).toContain("--budget N  (APP_BUDGET)");
  });

  test("the Markdown tables list every flag once, and replace a README's section", () => {
    const md = optionsMarkdown(SPEC, PROGRAM);
    for (const flag of ["grpc-port", "secure", "body-mode", "weight", "adapters", "budget"]) expect(md.split(`\`--${flag} `).length).toBe(2);
    expect(md).toContain("| `--body-mode auto\\|buffered` | `APP_BODY_MODE` | `\"auto\"` | body mode |");
    const readme = "# app\n<!-- options:begin -->\nold\n<!-- options:end -->\nafter\n";
    expect(withOptionsSection(readme, md)).toBe(`# app\n<!-- options:begin -->\n${md}<!-- options:end -->\nafter\n`);
  });
});

describe("jsonObjectText", () => {
  test("text that is a JSON object is kept as it is (1.0 stays 1.0); an object (a config file's) is written as JSON; anything else is refused", () => {
    expect(jsonObjectText.parse('{"a": 1.0}')).toBe('{"a": 1.0}');
    expect(jsonObjectText.parse({ a: 1 })).toBe('{"a":1}');
    for (const bad of ["{a", "[1]", "null", "3"]) expect(jsonObjectText.safeParse(bad).success).toBe(false);
  });
});
