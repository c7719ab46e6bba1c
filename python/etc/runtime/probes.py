"""Small hand-written CUDA kernels the runtime's timer and the GPU kit use
besides the compiled programs: a spin that keeps the GPU busy while the host
queues timed work behind it, and the probes of what the static schedule
assumes about the hardware (which SM each CTA lands on, how many are
resident at once) and of `%globaltimer`'s resolution.

The PTX is PTX ISA 7.0 for sm_80, which every driver from CUDA 11.0 on
JIT-compiles for any chip from sm_80 on. Its first line names it, so that a
stand-in driver (test/python/fake_cuda) can recognise the module and play
its kernels on the host.

Kernels:
  etc_spin(ns: u64)                 grid 1, block 1: returns once %globaltimer
                                    has advanced by `ns` nanoseconds
  etc_probe_sm(out: u64*, ns: u64)  any grid: thread 0 of CTA b writes
                                    out[4 b .. 4 b + 3] = (%smid, start, end,
                                    %nsmid), spinning `ns` ns between start
                                    and end so that resident CTAs overlap
  etc_probe_timer(out: u64*, n: u32)  grid 1, block 1: n consecutive reads of
                                    %globaltimer into out[0 .. n)
"""

from __future__ import annotations

#: The first line of the module: what a stand-in driver looks for.
MARKER = "// etc-builtin: probes"

PTX = MARKER + r"""
.version 7.0
.target sm_80
.address_size 64

.visible .entry etc_spin(.param .u64 etc_spin_ns)
{
	.reg .u64 	%start, %now, %limit, %ns;
	.reg .pred 	%more;
	ld.param.u64 	%ns, [etc_spin_ns];
	mov.u64 	%start, %globaltimer;
	add.u64 	%limit, %start, %ns;
$SPIN:
	nanosleep.u32 	64;
	mov.u64 	%now, %globaltimer;
	setp.lt.u64 	%more, %now, %limit;
	@%more bra 	$SPIN;
	ret;
}

.visible .entry etc_probe_sm(.param .u64 etc_probe_sm_out, .param .u64 etc_probe_sm_ns)
{
	.reg .u32 	%thread, %cta, %sm, %sms;
	.reg .u64 	%out, %ns, %start, %now, %limit, %offset, %at, %word;
	.reg .pred 	%other, %more;
	mov.u32 	%thread, %tid.x;
	setp.ne.u32 	%other, %thread, 0;
	@%other bra 	$DONE;
	ld.param.u64 	%out, [etc_probe_sm_out];
	ld.param.u64 	%ns, [etc_probe_sm_ns];
	cvta.to.global.u64 	%out, %out;
	mov.u32 	%cta, %ctaid.x;
	mov.u32 	%sm, %smid;
	mov.u32 	%sms, %nsmid;
	mov.u64 	%start, %globaltimer;
	add.u64 	%limit, %start, %ns;
$SPIN:
	mov.u64 	%now, %globaltimer;
	setp.lt.u64 	%more, %now, %limit;
	@%more bra 	$SPIN;
	mul.wide.u32 	%offset, %cta, 32;
	add.u64 	%at, %out, %offset;
	cvt.u64.u32 	%word, %sm;
	st.global.u64 	[%at], %word;
	st.global.u64 	[%at+8], %start;
	st.global.u64 	[%at+16], %now;
	cvt.u64.u32 	%word, %sms;
	st.global.u64 	[%at+24], %word;
$DONE:
	ret;
}

.visible .entry etc_probe_timer(.param .u64 etc_probe_timer_out, .param .u32 etc_probe_timer_n)
{
	.reg .u32 	%i, %n;
	.reg .u64 	%out, %now, %offset, %at;
	.reg .pred 	%more;
	ld.param.u64 	%out, [etc_probe_timer_out];
	ld.param.u32 	%n, [etc_probe_timer_n];
	cvta.to.global.u64 	%out, %out;
	mov.u32 	%i, 0;
$READ:
	mov.u64 	%now, %globaltimer;
	mul.wide.u32 	%offset, %i, 8;
	add.u64 	%at, %out, %offset;
	st.global.u64 	[%at], %now;
	add.u32 	%i, %i, 1;
	setp.lt.u32 	%more, %i, %n;
	@%more bra 	$READ;
	ret;
}
"""

#: The kernels of the module, with their parameters' ctypes (in order).
KERNELS = {"etc_spin": ("u64",), "etc_probe_sm": ("u64", "u64"),
           "etc_probe_timer": ("u64", "u32")}
