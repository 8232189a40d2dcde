import { Clock } from "../src/cursor";

/** A clock the test advances by hand: timers fire in order of their due time. */
export class FakeClock implements Clock {
  time = 0;
  private timers = new Map<number, { at: number; f: () => void }>();
  private next = 1;
  setTimeout(f: () => void, ms: number): unknown {
    const id = this.next++;
    this.timers.set(id, { at: this.time + ms, f });
    return id;
  }
  clearTimeout(h: unknown): void {
    this.timers.delete(h as number);
  }
  advance(ms: number): void {
    const end = this.time + ms;
    for (;;) {
      const due = [...this.timers].filter(([, t]) => t.at <= end).sort((a, b) => a[1].at - b[1].at)[0];
      if (!due) break;
      this.timers.delete(due[0]);
      this.time = due[1].at;
      due[1].f();
    }
    this.time = end;
  }
}
