export { DEFAULT_BACKOFF, listWatch, statusOf, type ListWatch, type ListWatchOptions } from "./list-watch.ts";
export { defaultKubeConfig } from "./config.ts";
