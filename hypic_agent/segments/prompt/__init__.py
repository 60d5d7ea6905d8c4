"""Prompt building: segment kinds, framing, tokenization, content keys, splitting, the prompt plan.

Pipeline: ``SegmentIn`` (wire, ``kinds``) -> ``Segment`` -> ``CanonicalSegment`` (framed by
``framing``, tokenized by ``tokenize``, keyed by ``keys``) -> ``PromptPlan`` (``plan``); a segment
given by ``id`` becomes a ``CanonicalSegment`` from its stored row (``resolve``), and long segments
are cut into pieces (``split``). Pure: no torch, no storage (``segments.store`` builds on this).
"""
