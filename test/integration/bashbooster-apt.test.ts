// The library's apt helpers with the real apt-get and dpkg, in a chroot of a cached
// debootstrapped Debian root (an overlay, so the cache stays untouched) with a local repository
// holding a package built here. Needs root (and debootstrap, the first time).
import t from "tap";
import { existsSync } from "node:fs";
import path from "node:path";
import { chrootRoot } from "../lib/chroot-root.ts";
import { debianRoot, MINIMAL_PACKAGES } from "../../scripts/lib/debian-root.ts";

const isRoot = process.getuid?.() === 0;

t.test(
  "bb-apt-install / bb-apt-remove with the real apt-get and dpkg",
  { skip: isRoot ? false : "needs root (debootstrap, chroot, overlay mount)" },
  async (t) => {
    const node = await chrootRoot((await debianRoot({ packages: MINIMAL_PACKAGES })).dir);
    t.teardown(() => node.cleanup());
    const step = (script: string) => node.script(script);
    const events =
      'bb-event-on bb-package-installed on_installed\non_installed() { echo "installed:$1"; }\n' +
      'bb-event-on bb-package-removed on_removed\non_removed() { echo "removed:$1"; }\n';
    const installed = async () =>
      // biome-ignore lint/suspicious/noTemplateCurlyInString: a dpkg-query format
      (await step("dpkg-query -W -f='${Status}' bb-test-hello 2>/dev/null || true\n")).stdout.endsWith(" installed");

    t.notOk(await installed());
    const first = await step(`${events}bb-apt-install bb-test-hello\n`);
    t.equal(first.code, 0, first.stderr);
    t.equal(first.stdout.trim().split("\n").pop(), "installed:bb-test-hello");
    t.match(first.stderr, /Updating apt cache/);
    t.ok(await installed(), "installed by apt-get");
    t.equal((await step("apt-mark showhold\n")).stdout, "", "not held: Deckhouse holds nothing it installs");
    t.ok(existsSync(path.join(node.root, "var/lib/bashible/.bb-workspace/flag/apt-updated")), "flag apt-updated");

    const again = await step(`${events}bb-apt-install bb-test-hello\n`);
    t.notMatch(again.stderr, /Updating apt cache|Installing/, "nothing to do");
    t.equal(
      again.stdout,
      "installed:bb-test-hello\n",
      "the event repeats until the converge ends (its handlers may not have run)",
    );
    await step("bb-run-finished\n");
    t.equal((await step(`${events}bb-apt-install bb-test-hello\n`)).stdout, "", "after the converge: no event");
    const forced = await step(`${events}bb-apt-install --force bb-test-hello\n`);
    t.equal(forced.code, 0, forced.stderr);
    t.match(forced.stderr, /Installing packages 'bb-test-hello'/, "--force installs it although it is there");
    t.match(forced.stdout, /\ninstalled:bb-test-hello\n$/, "and fires the event");

    t.equal(
      (
        await step(
          "bb-apt-package? bb-test-hello=1.* && echo yes; bb-apt-package? 'bb-test-hello=2.*' || echo no; bb-apt-package? bb-test-hello=1.2-1 && echo exact\n",
        )
      ).stdout,
      "yes\nno\nexact\n",
      "version patterns",
    );

    const missing = await step("bb-apt-install no-such-package-here\necho never\n");
    t.not(missing.code, 0);
    t.notMatch(missing.stdout, /never/);
    t.match(missing.stderr, /Failed to install packages 'no-such-package-here'/);

    const removed = await step(`${events}bb-apt-remove bb-test-hello not-installed-either\n`);
    t.equal(removed.code, 0, removed.stderr);
    t.match(removed.stdout, /^removed:bb-test-hello\n$/m);
    t.notOk(await installed(), "removed by apt-get, although held");
  },
);
