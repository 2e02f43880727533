// @kv-epp/options: every program's options declared once (typed schema, default, help, section) and
// resolved by one rule, flag > environment variable > config file > default.
export { count, envName, flagName, group, jsonObjectText, nonNegative, oneOf, opt, port, positive, type Option, type Spec, type TextKind, type Values } from "./option.ts";
export { ConfigError, resolveOptions, type Inputs, type Layer, type Program, type Resolved } from "./resolve.ts";
export { defaultText, optionsMarkdown, PRECEDENCE, usageText, withOptionsSection } from "./help.ts";
