"""Control calls to one SGLang worker, each a typed success or a ``WorkerOpError``.

These are the SGLang 0.5.23 mechanics PEARL composes into reconfigurations: pause and
continue generation, release and resume memory (torch memory saver), weight updates with
versions, in-place prefill <-> decode switches, and ``/model_info`` for reconciliation.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import aiohttp


class WorkerOpError(RuntimeError):
    def __init__(self, url: str, op: str, message: str) -> None:
        super().__init__(f"{op} on {url}: {message}")
        self.url, self.op = url, op


@dataclass(frozen=True)
class WorkerOps:
    session: aiohttp.ClientSession
    timeout_s: float = 120.0

    async def _call(self, url: str, method: str, path: str, body: Any = None, *,
                    timeout_s: float | None = None) -> Any:
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with self.session.request(method, url + path, json=body, timeout=timeout) as r:
                data = await r.read()
                if r.status >= 400:
                    raise WorkerOpError(url, path, f"HTTP {r.status}: {data[:300].decode(errors='replace')}")
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
            raise WorkerOpError(url, path, repr(e)) from e
        if not data.strip():
            return None
        try:
            import json

            out = json.loads(data)
        except ValueError:
            return data.decode(errors="replace")
        if isinstance(out, dict) and out.get("success") is False:
            raise WorkerOpError(url, path, str(out.get("message")))
        return out

    async def health(self, url: str, *, timeout_s: float | None = None) -> None:
        await self._call(url, "GET", "/health", timeout_s=timeout_s)

    async def server_info(self, url: str) -> dict[str, Any]:
        return await self._call(url, "GET", "/server_info")

    async def model_info(self, url: str) -> dict[str, Any]:
        return await self._call(url, "GET", "/model_info")

    async def pause(self, url: str, mode: str = "abort") -> None:
        await self._call(url, "POST", "/pause_generation", {"mode": mode})

    async def resume_generation(self, url: str) -> None:
        await self._call(url, "POST", "/continue_generation", {})

    async def release_memory(self, url: str) -> None:
        await self._call(url, "POST", "/release_memory_occupation", {"tags": None})

    async def frees_memory_on_release(self, url: str) -> bool | None:
        """Whether ``/release_memory_occupation`` really frees GPU memory on this worker:
        SGLang reports ``enable_memory_saver`` in ``/server_info`` (without it a release
        answers success and frees nothing). None when the engine does not say."""
        info = await self._call(url, "GET", "/server_info")
        value = info.get("enable_memory_saver") if isinstance(info, dict) else None
        return value if isinstance(value, bool) else None

    async def resume_memory(self, url: str) -> None:
        await self._call(url, "POST", "/resume_memory_occupation", {"tags": None})

    async def update_from_disk(self, url: str, *, model_path: str, version: str,
                               load_format: str | None = None) -> None:
        body: dict[str, Any] = {"model_path": model_path, "weight_version": version}
        if load_format:
            body["load_format"] = load_format
        await self._call(url, "POST", "/update_weights_from_disk", body)

    async def set_version(self, url: str, version: str) -> None:
        await self._call(url, "POST", "/update_weight_version", {"new_version": version,
                                                                  "abort_all_requests": False})

    async def init_weight_group(self, url: str, *, master_address: str, master_port: int, rank_offset: int,
                                world_size: int, group_name: str, backend: str, timeout_s: float) -> None:
        """Returns only once every rank, the trainer's rank 0 included, has joined."""
        await self._call(url, "POST", "/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend}, timeout_s=timeout_s)

    async def destroy_weight_group(self, url: str, group_name: str) -> None:
        await self._call(url, "POST", "/destroy_weights_update_group", {"group_name": group_name})

    async def update_from_distributed(self, url: str, *, group_name: str, names: list[str], dtypes: list[str],
                                      shapes: list[list[int]], version: str) -> None:
        """Receive one broadcast of every tensor from rank 0. SGLang on CPU refuses this
        outside ``/begin_weight_update`` .. ``/end_weight_update`` (and a trainer already
        broadcasting then hangs), so callers bracket it with ``begin``/``end``."""
        await self._call(url, "POST", "/begin_weight_update", {})
        try:
            await self._call(url, "POST", "/update_weights_from_distributed", {
                "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name,
                "flush_cache": True, "abort_all_requests": False, "weight_version": version})
        except BaseException:
            with contextlib.suppress(WorkerOpError):  # the update's error is the one to report
                await self._call(url, "POST", "/end_weight_update", {})
            raise
        await self._call(url, "POST", "/end_weight_update", {})

    async def switch_role(self, url: str, role: str) -> dict[str, Any]:
        body: dict[str, Any] = {"new_role": role}
        if role == "decode":
            body["decode_cuda_graph_memory_gb"] = 0
        return await self._call(url, "POST", "/pd_role_switch", body)

    async def pd_probe(self, *, prefill_url: str, bootstrap_port: int, decode_url: str) -> None:
        """One tiny PD request through this pair: proves the KV-transfer path (bootstrap,
        registration, transfer) works before the pair serves real traffic."""
        import secrets
        from urllib.parse import urlparse

        body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 2, "ignore_eos": True},
                "bootstrap_host": urlparse(prefill_url).hostname, "bootstrap_port": bootstrap_port,
                "bootstrap_room": secrets.randbits(63), "rid": f"pearl-probe-{secrets.token_hex(6)}"}
        _, out = await asyncio.gather(self._call(prefill_url, "POST", "/generate", body),
                                      self._call(decode_url, "POST", "/generate", body))
        if not isinstance(out, dict) or not out.get("output_ids"):
            raise WorkerOpError(decode_url, "pd probe", f"unexpected answer {str(out)[:200]}")

    async def loads(self, url: str) -> dict[str, Any]:
        return await self._call(url, "GET", "/v1/loads")
