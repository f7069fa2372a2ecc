"""Replay: a recorded run played back as an animation, frame by recorded frame, in one offline HTML file.

``frames`` lists a trace's events at their measured times, ``scenes`` turns traces into the player's
data, ``attention`` keeps the prefill step's attention maps (one byte a cell), ``build`` makes the three
scenes of ``experiments.replay_runs``, and ``page`` writes the HTML (the player's CSS and JS are the
files beside it).
"""
