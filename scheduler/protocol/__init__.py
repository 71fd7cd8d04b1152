"""The protocol layer: everything that knows how zsched's data looks in Redis.

Key layout (:mod:`.keys`), record bytes (:mod:`.codec`), job ids (:mod:`.ids`), the Lua script
loader and transport (:mod:`.scripts`, :mod:`.transport`), connections and durability waits
(:mod:`.connection`, :mod:`.durability`), the typed replies of the scripts (:mod:`.replies`) and
the shared vocabulary (:mod:`.errors`, :mod:`.models`, :mod:`.timeutil`, :mod:`.cron`,
:mod:`.config`). Modules here import only each other: clients, the tier, the workers and the
operator shell build on this layer, never the other way round.
"""
