// The one wall clock of fencing. Every part takes it as `now` (FencingOptions.clock, injected by
// tests), so a decision, a status line, a certificate check and a Lease age never compare two
// different clocks. Timers (setInterval, setTimeout) stay real; the pet gap histogram uses the
// monotonic hrtime, which is a duration, not a time of day.
export type Clock = () => number;

export const systemClock: Clock = () => Date.now();
