# tools/setup's summary of `apt-get -s install` transcripts (read on stdin): one line per package
# installed or upgraded (the first `Inst` line of each), then one line counting those that come
# from Debian unstable and naming the core ones among them (-v core="libc6 dpkg ...").
# Plain POSIX awk: a minimal Debian has mawk, not gawk.
#
# An Inst line: `Inst NAME [OLD] (NEW RELEASE[, RELEASE] [ARCH])[ [BROKEN-DEPENDS ]]`, where
# [OLD] is there only for an upgrade and [ARCH] only for arch-specific packages.
BEGIN { n = split(core, names, " "); for (i = 1; i <= n; i++) is_core[names[i]] = 1 }
/^Inst / && !seen[$2]++ {
    old = ($3 ~ /^\[/) ? substr($3, 2, length($3) - 2) : ""
    rest = $0
    sub(/^[^(]*\(/, "", rest)
    sub(/ \[.*$/, "", rest)
    sub(/\).*$/, "", rest)
    version = rest; sub(/ .*$/, "", version)
    suite = rest; sub(/^[^ ]* /, "", suite)
    printf "  %-8s %s %s%s (%s)\n", old == "" ? "install" : "upgrade", $2, old == "" ? "" : old " -> ", version, suite
    total++
    if (suite ~ /unstable/) {
        moved++
        if (old != "") upgraded++
        if ($2 in is_core) cores = cores " " $2
    }
}
END {
    printf "%d packages installed or upgraded; %d of them from Debian unstable (%d already installed, moved ", total, moved, upgraded
    print "to unstable's versions)" (cores == "" ? "" : ", among them" cores)
}
