// bun test preload (root bunfig.toml): the EPP processes tests start (their own, the demo's) skip the decision
// warm-up (--warm-up-picks; the EPP README): each would spend ~0.5-1 s of CPU on it at start, beside the other test
// files running. Its own tests ask for it by flag, which wins over the variable; a simulated cluster's pods see
// only what their manifests set, and warm up as deployed.
process.env.DYN_EPP_WARM_UP_PICKS ??= "0";
